//! Poison never stalls the outbox: a row the relay can never publish is
//! parked in `outbox_parked` with a reason, a metric and one log line, and
//! every other row — the later rows of the same order included — flows on,
//! exactly once and in order per order.

use localservers::{free_port, Nats};
use soldonce_tests::relay::{binary, record_event, test_metadata};
use soldonce_tests::{eventually, TestApp};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

/// The private server's `max_payload`: every normal event fits, an order
/// with a long shipping address does not.
const MAX_PAYLOAD: u32 = 1024;

/// outbox-relay as a process of its own, so its `/metrics` and its log are its own.
pub(super) struct RelayProcess {
    port: u16,
    log: PathBuf,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl RelayProcess {
    async fn start(database_url: &str, nats_url: &str) -> RelayProcess {
        RelayProcess::start_polling(database_url, nats_url, "200ms").await
    }

    /// A relay that polls every `poll` (`OUTBOX_POLL_INTERVAL`) when no
    /// notification comes.
    pub(super) async fn start_polling(
        database_url: &str,
        nats_url: &str,
        poll: &str,
    ) -> RelayProcess {
        let dir = tempfile::tempdir().expect("log dir");
        let log = dir.path().join("outbox-relay.log");
        let port = free_port().expect("port");
        let child = tokio::process::Command::new(binary("outbox-relay"))
            .env("DATABASE_URL", database_url)
            .env("NATS_URL", nats_url)
            .env("OUTBOX_RELAY_ADDR", format!("127.0.0.1:{port}"))
            .env("OUTBOX_POLL_INTERVAL", poll)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("start outbox-relay");
        let relay = RelayProcess {
            port,
            log,
            _child: child,
            _dir: dir,
        };
        soldonce_tests::poll::ready("outbox-relay", &format!("http://127.0.0.1:{port}/readyz"))
            .await;
        relay
    }

    /// The relay's metrics: (name, labels sorted as `k=v,…`) → value.
    pub(super) async fn metrics(&self) -> HashMap<(String, String), f64> {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text");
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("Prometheus text");
        scrape
            .samples
            .into_iter()
            .filter_map(|s| {
                let value = match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => return None,
                };
                let mut labels: Vec<String> =
                    s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                Some(((s.metric, labels.join(",")), value))
            })
            .collect()
    }

    /// Waits until the metric reads `want`.
    async fn await_metric(&self, name: &str, labels: &str, want: f64) {
        let key = (name.to_owned(), labels.to_owned());
        eventually(
            &format!("{name}{{{labels}}} to read {want}"),
            Duration::from_secs(30),
            || {
                let key = key.clone();
                async move { (self.metrics().await.get(&key) == Some(&want)).then_some(()) }
            },
        )
        .await;
    }

    /// The log lines that report a parked row.
    fn parked_lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("parked"))
            .map(str::to_owned)
            .collect()
    }
}

/// Every message in the stream: Nats-Msg-Id → stream sequences it was stored at.
pub(super) async fn stream_sequences(nats_url: &str) -> HashMap<Uuid, Vec<u64>> {
    let js = bus::connect(nats_url).await.expect("connect nats");
    let stream = js.get_stream(bus::STREAM).await.expect("stream exists");
    let last = stream.cached_info().state.last_sequence;
    let mut seen: HashMap<Uuid, Vec<u64>> = HashMap::new();
    for seq in 1..=last {
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        let id = msg
            .headers
            .get("Nats-Msg-Id")
            .and_then(|v| v.as_str().parse::<Uuid>().ok())
            .expect("a Nats-Msg-Id");
        seen.entry(id).or_default().push(seq);
    }
    seen
}

/// Places a one-unit order of BULK; returns its id.
async fn place(app: &TestApp, shipping: Option<serde_json::Value>) -> Uuid {
    let mut body = serde_json::json!({ "lines": [{ "sku": "BULK", "quantity": 1 }] });
    if let Some(s) = shipping {
        body["shipping"] = s;
    }
    let placed = app
        .place(&app.token, &Uuid::new_v4().to_string(), &body)
        .await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    placed.body["id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid")
}

async fn cancel(app: &TestApp, order: Uuid) {
    assert_eq!(
        app.post_empty(&app.token, &format!("/v1/orders/{order}/cancel"))
            .await
            .status,
        200
    );
}

/// The order's event ids, in the order they were recorded.
async fn events_of(app: &TestApp, order: Uuid) -> Vec<(Uuid, String)> {
    sqlx::query_as("SELECT event_id, type FROM events WHERE stream_id = $1 ORDER BY version")
        .bind(order)
        .fetch_all(&app.pool)
        .await
        .expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_too_large_for_nats_is_parked_and_every_other_event_flows_in_order() {
    let app = TestApp::spawn().await;
    app.add_product("BULK", 100, 1_000).await;
    let nats = Nats::start_temporary_with_max_payload(MAX_PAYLOAD)
        .expect("private nats with a small max_payload");

    // Written before any relay runs, so the poison row sits in one batch
    // with the rest, and its order's cancellation waits behind it.
    let mut normal = Vec::new();
    for _ in 0..20 {
        normal.push(place(&app, None).await);
    }
    let long = "x".repeat(200);
    let shipping = serde_json::json!({ "name": long, "line1": long, "city": long, "postal_code": long, "country": "BR" });
    let poison = place(&app, Some(shipping)).await;
    cancel(&app, poison).await;
    for _ in 0..20 {
        normal.push(place(&app, None).await);
    }
    for order in &normal[..5] {
        cancel(&app, *order).await;
    }
    let poison_events = events_of(&app, poison).await;
    assert_eq!(
        poison_events
            .iter()
            .map(|e| e.1.as_str())
            .collect::<Vec<_>>(),
        ["order.placed.v1", "order.cancelled.v1"]
    );
    let (poison_placed, poison_cancelled) = (poison_events[0].0, poison_events[1].0);
    // The premise: only the poison row is over the limit, every other with room for its headers.
    let waiting: Vec<i64> = sqlx::query_scalar("SELECT unnest(positions) FROM outbox")
        .fetch_all(&app.pool)
        .await
        .expect("positions");
    let messages = store::stream_copy::messages(&app.pool, &waiting)
        .await
        .expect("the messages the relay will build");
    assert_eq!(messages.len(), waiting.len());
    let sizes: Vec<(Uuid, i32)> = messages
        .iter()
        .map(|m| (m.event_id, m.payload.len() as i32))
        .collect();
    for (id, size) in &sizes {
        if *id == poison_placed {
            assert!(
                *size > MAX_PAYLOAD as i32,
                "the poison event is only {size} bytes"
            );
        } else {
            assert!(
                *size < MAX_PAYLOAD as i32 - 300,
                "a normal event of {size} bytes is too close to max_payload"
            );
        }
    }

    let relay = RelayProcess::start(&app.database_url, &nats.url()).await;
    // And it keeps relaying afterwards.
    for _ in 0..10 {
        normal.push(place(&app, None).await);
    }
    eventually(
        "the outbox to drain around the parked row",
        Duration::from_secs(60),
        || async {
            (app.count("SELECT count(*) FROM outbox").await == 0
                && app.count("SELECT count(*) FROM outbox_parked").await == 1)
                .then_some(())
        },
    )
    .await;

    let (id, subject, reason, stream_id): (Uuid, String, String, Uuid) =
        sqlx::query_as("SELECT id, subject, reason, stream_id FROM outbox_parked")
            .fetch_one(&app.pool)
            .await
            .expect("the parked row");
    assert_eq!(
        (id, reason.as_str(), stream_id),
        (poison_placed, "too_large", poison)
    );
    assert_eq!(subject, format!("soldonce.order.placed.{poison}"));

    let all: HashSet<Uuid> = sqlx::query_as::<_, (Uuid,)>("SELECT event_id FROM events")
        .fetch_all(&app.pool)
        .await
        .expect("events")
        .into_iter()
        .map(|r| r.0)
        .collect();
    let seen = stream_sequences(&nats.url()).await;
    let doubled: Vec<_> = seen.iter().filter(|(_, seqs)| seqs.len() != 1).collect();
    assert!(
        doubled.is_empty(),
        "events in the stream more than once: {doubled:?}"
    );
    let published: HashSet<Uuid> = seen.keys().copied().collect();
    let expected: HashSet<Uuid> = all
        .iter()
        .copied()
        .filter(|e| *e != poison_placed)
        .collect();
    assert_eq!(
        published, expected,
        "every event but the parked one, exactly once"
    );
    assert!(
        seen.contains_key(&poison_cancelled),
        "the parked row did not hold its order's next event"
    );
    for order in &normal[..5] {
        let events = events_of(&app, *order).await;
        let seqs: Vec<u64> = events.iter().map(|(e, _)| seen[e][0]).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "order {order}: events out of order in the stream: {seqs:?}"
        );
    }

    relay.await_metric("soldonce_outbox_parked", "", 1.0).await;
    relay
        .await_metric("soldonce_outbox_parked_total", "reason=too_large", 1.0)
        .await;
    relay
        .await_metric("soldonce_outbox_parked_total", "reason=rejected", 0.0)
        .await;
    relay.await_metric("soldonce_outbox_backlog", "", 0.0).await;
    let lines = relay.parked_lines();
    assert_eq!(lines.len(), 1, "one log line per parked row: {lines:#?}");
    for part in [poison_placed.to_string(), subject, "too_large".to_owned()] {
        assert!(
            lines[0].contains(&part),
            "the log line names {part}: {}",
            lines[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_stream_refuses_or_cannot_route_is_parked_with_its_reason() {
    let app = TestApp::spawn().await;
    let nats = Nats::start_temporary().expect("private nats");
    let relay = RelayProcess::start(&app.database_url, &nats.url()).await;
    // Under the server's max_payload but over the stream's own limit: JetStream refuses it (error 10054).
    let js = bus::connect(&nats.url()).await.expect("connect nats");
    let mut config = soldonce_tests::relay::stream_config(&js).await;
    config.max_message_size = 4096;
    js.update_stream(config)
        .await
        .expect("limit the stream's message size");

    let (x, y, z) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let (big, after_big, unroutable, after_unroutable, other) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    // Events written by hand: a type with a space makes a subject NATS does
    // not take.
    let rows = [
        (
            big,
            x,
            "test.big.v1",
            serde_json::json!({ "blob": "x".repeat(8_000) }),
        ),
        (after_big, x, "test.after.v1", serde_json::json!({ "n": 1 })),
        (
            unroutable,
            y,
            "test.bad subject.v1",
            serde_json::json!({ "n": 2 }),
        ),
        (
            after_unroutable,
            y,
            "test.after.v1",
            serde_json::json!({ "n": 3 }),
        ),
        (other, z, "test.other.v1", serde_json::json!({ "n": 4 })),
    ];
    let mut tx = app.pool.begin().await.expect("begin");
    for (id, stream_id, type_name, data) in rows {
        record_event(&mut tx, id, stream_id, type_name, data, test_metadata()).await;
    }
    tx.commit().await.expect("commit");

    eventually("the outbox to drain", Duration::from_secs(60), || async {
        (app.count("SELECT count(*) FROM outbox").await == 0).then_some(())
    })
    .await;
    let parked: HashMap<Uuid, String> = sqlx::query_as("SELECT id, reason FROM outbox_parked")
        .fetch_all(&app.pool)
        .await
        .expect("parked")
        .into_iter()
        .collect();
    assert_eq!(
        parked,
        HashMap::from([
            (big, "too_large".to_owned()),
            (unroutable, "bad_subject".to_owned()),
        ])
    );
    let seen = stream_sequences(&nats.url()).await;
    assert_eq!(
        seen.keys().copied().collect::<HashSet<_>>(),
        HashSet::from([after_big, after_unroutable, other])
    );
    assert!(seen.values().all(|s| s.len() == 1));
    relay.await_metric("soldonce_outbox_parked", "", 2.0).await;
    relay
        .await_metric("soldonce_outbox_parked_total", "reason=too_large", 1.0)
        .await;
    relay
        .await_metric("soldonce_outbox_parked_total", "reason=bad_subject", 1.0)
        .await;
    assert_eq!(relay.parked_lines().len(), 2);
}

/// Runs promtool; a machine without it fails the test, saying what to install.
fn promtool(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (install Debian's prometheus: . deploy/setup.sh)")
        })
}

#[test]
fn the_parked_rows_alert_rule_is_valid_and_fires() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/alerts.yml");
    let text = std::fs::read_to_string(&rules).expect("deploy/alerts.yml");
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).expect("YAML");
    let groups = docs[0]["groups"].as_vec().expect("groups");
    let group = groups
        .iter()
        .find(|g| g["name"].as_str() == Some("soldonce"))
        .expect("group soldonce");
    let rule = group["rules"]
        .as_vec()
        .expect("rules")
        .iter()
        .find(|r| r["alert"].as_str() == Some("SoldonceOutboxParked"))
        .expect("alert SoldonceOutboxParked");
    let expr = rule["expr"].as_str().expect("expr");
    assert!(
        expr.contains("soldonce_outbox_parked") && expr.contains("> 0"),
        "{expr}"
    );

    let checked = promtool(&["check".as_ref(), "rules".as_ref(), rules.as_os_str()]);
    assert!(
        checked.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    // Two relays report the same parked row: one alert fires, counting it once; with none parked, none does.
    let dir = tempfile::tempdir().expect("dir");
    let unit = dir.path().join("alerts_test.yml");
    let test = format!(
        r#"rule_files: ["{}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'soldonce_outbox_parked{{instance="relay-a"}}'
        values: '0 0 1 1'
      - series: 'soldonce_outbox_parked{{instance="relay-b"}}'
        values: '0 0 1 1'
    alert_rule_test:
      - eval_time: 1m
        alertname: SoldonceOutboxParked
        exp_alerts: []
      - eval_time: 3m
        alertname: SoldonceOutboxParked
        exp_alerts:
          - exp_labels:
              severity: warning
            exp_annotations:
              summary: "1 outbox row(s) parked: events that will never be published"
              description: {}
"#,
        rules.canonicalize().expect("path").display(),
        // A JSON string is a YAML double-quoted scalar.
        serde_json::to_string(
            rule["annotations"]["description"]
                .as_str()
                .expect("description")
        )
        .expect("quote")
    );
    std::fs::write(&unit, test).expect("write the rule test");
    let tested = promtool(&["test".as_ref(), "rules".as_ref(), unit.as_os_str()]);
    assert!(
        tested.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );
}
