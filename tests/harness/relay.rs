//! Running outbox-relay in tests: in-process, or as a real process that can
//! be killed with SIGKILL; and reading the stream back.

use async_nats::jetstream;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use uuid::Uuid;

/// The built `outbox-relay` binary beside the test binary.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// Runs the `soldonce` CLI with only these variables set (and PATH);
/// returns its exit code and what it printed, stdout then stderr.
pub fn soldonce(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(binary("soldonce"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run soldonce");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Starts the relay binary as a child process (killed when dropped).
pub fn spawn_process(database_url: &str, nats_url: &str) -> tokio::process::Child {
    tokio::process::Command::new(binary("outbox-relay"))
        .env("DATABASE_URL", database_url)
        .env("NATS_URL", nats_url)
        .env("OUTBOX_RELAY_ADDR", "127.0.0.1:0")
        .env("OUTBOX_POLL_INTERVAL", "200ms")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start outbox-relay")
}

/// Starts a relay in-process; it stops when the returned sender is dropped.
pub async fn spawn_in_process(
    database_url: &str,
    nats_url: &str,
) -> tokio::sync::oneshot::Sender<()> {
    spawn_in_process_polling(database_url, nats_url, Duration::from_millis(200)).await
}

/// [`spawn_in_process`] with its fallback poll every `poll_interval`.
pub async fn spawn_in_process_polling(
    database_url: &str,
    nats_url: &str,
    poll_interval: Duration,
) -> tokio::sync::oneshot::Sender<()> {
    spawn_in_process_with(database_url, nats_url, |s| s.poll_interval = poll_interval).await
}

/// [`spawn_in_process`] with its settings changed by `tweak`.
pub async fn spawn_in_process_with(
    database_url: &str,
    nats_url: &str,
    tweak: impl FnOnce(&mut outbox_relay::Settings),
) -> tokio::sync::oneshot::Sender<()> {
    let mut settings = outbox_relay::Settings {
        addr: "127.0.0.1:0".parse().expect("addr"),
        database_url: database_url.to_owned(),
        nats_url: nats_url.to_owned(),
        batch_size: 200,
        poll_interval: Duration::from_millis(200),
        lanes: 2,
        vacuum_after: 5000,
        stream: bus::StreamSettings::default(),
        repair: outbox_relay::RepairSettings::default(),
    };
    tweak(&mut settings);
    let app = outbox_relay::Application::build(settings)
        .await
        .expect("build relay");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    stop
}

/// Every message in the SOLDONCE stream: Nats-Msg-Id → (count, payload).
pub async fn read_stream(nats_url: &str) -> HashMap<Uuid, (usize, serde_json::Value)> {
    let js = bus::connect(nats_url).await.expect("connect nats");
    let stream = js.get_stream(bus::STREAM).await.expect("stream exists");
    let last = stream.cached_info().state.last_sequence;
    let mut seen: HashMap<Uuid, (usize, serde_json::Value)> = HashMap::new();
    for seq in 1..=last {
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        let id = msg
            .headers
            .get("Nats-Msg-Id")
            .and_then(|v| v.as_str().parse::<Uuid>().ok())
            .expect("every message has a Nats-Msg-Id");
        let payload: serde_json::Value =
            serde_json::from_slice(&msg.payload).expect("JSON payload");
        seen.entry(id).or_insert((0, payload)).0 += 1;
    }
    seen
}

/// The soldonce stream's configuration as the server has it, to change
/// and put back with `update_stream`.
pub async fn stream_config(js: &jetstream::Context) -> jetstream::stream::Config {
    js.get_stream(bus::STREAM)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .config
        .clone()
}

/// How many messages the stream holds (0 before it exists).
pub async fn stream_len(js: &jetstream::Context) -> u64 {
    match js.get_stream(bus::STREAM).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Metadata as the write path records it, for an event written by hand.
pub fn test_metadata() -> events::Metadata {
    events::Metadata::spontaneous("test", Uuid::now_v7())
}

/// Appends events written by hand (`(event id, stream id, version, type)`,
/// empty data) in one statement, the way the write path appends a batch:
/// their outbox rows are that statement's, up to 32 events a row. Returns
/// their positions, in the order given.
pub async fn append_in_one_statement(
    conn: &mut sqlx::PgConnection,
    events: &[(Uuid, Uuid, i32, &str)],
) -> Vec<i64> {
    let ids: Vec<Uuid> = events.iter().map(|e| e.0).collect();
    let streams: Vec<Uuid> = events.iter().map(|e| e.1).collect();
    let versions: Vec<i32> = events.iter().map(|e| e.2).collect();
    let types: Vec<&str> = events.iter().map(|e| e.3).collect();
    sqlx::query(&format!(
        "WITH appended AS ( \
             INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source) \
             SELECT i, s, v, t, '{{}}', gen_random_uuid(), gen_random_uuid(), 'test' \
             FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[]) WITH ORDINALITY AS x(i, s, v, t, n) ORDER BY n \
             RETURNING position, xmin) {}",
        store::outbox::QUEUE_SQL
    ))
    .bind(&ids)
    .bind(&streams)
    .bind(&versions)
    .bind(&types)
    .execute(&mut *conn)
    .await
    .expect("append events in one statement");
    sqlx::query_scalar(
        "SELECT e.position FROM unnest($1::uuid[]) WITH ORDINALITY AS x(id, n) \
         JOIN events e ON e.event_id = x.id ORDER BY x.n",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await
    .expect("positions")
}

/// Records one event written by hand, `type_name` about `stream_id` at the
/// stream's next version, with its outbox row, in `conn`'s transaction, the
/// way the write path does (the outbox row names the event by position);
/// returns its position. The relay publishes it on
/// `soldonce.<type_name without its version>.<stream_id>`.
pub async fn record_event(
    conn: &mut sqlx::PgConnection,
    event_id: Uuid,
    stream_id: Uuid,
    type_name: &str,
    data: serde_json::Value,
    meta: events::Metadata,
) -> i64 {
    sqlx::query_scalar(
        "WITH e AS ( \
             INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source, traceparent, tracestate) \
             SELECT $1, $2, coalesce(max(version), 0) + 1, $3, $4, $5, $6, $7, $8, $9 FROM events WHERE stream_id = $2 \
             RETURNING position, xmin) \
         INSERT INTO outbox (position, positions, tx) SELECT position, ARRAY[position], xmin::text::bigint FROM e RETURNING position",
    )
    .bind(event_id)
    .bind(stream_id)
    .bind(type_name)
    .bind(data)
    .bind(meta.correlation_id)
    .bind(meta.causation_id)
    .bind(meta.source)
    .bind(meta.traceparent)
    .bind(meta.tracestate)
    .fetch_one(conn)
    .await
    .expect("record an event by hand")
}
