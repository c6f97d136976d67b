//! Running services as an operator does: SIGTERM mid-load, a port taken
//! meanwhile, and `soldonce up` with `soldonce demo flash-sale`.

use futures::stream::{self, StreamExt};
use soldonce_tests::eventually;
use soldonce_tests::relay::{binary, read_stream};
use soldonce_tests::saga::assert_audit_clean;
use soldonce_tests::system::{System, SystemOptions, SERVICES};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Places an order for one MUG at checkout's current address; asserts the 202.
async fn place_one_mug(system: &System, key: &str) {
    let placed = system
        .place("checkout", &system.app.token, key, "MUG")
        .await;
    assert_eq!(placed.status, 202);
}

/// A port picked free can be taken before the service binds it (by another
/// test's server, or as any outgoing connection's local port). The service
/// then moves to a new port, and psp-sim, which sends its webhooks to
/// checkout, is restarted to follow it. The attempt that failed logged
/// why as a JSON line, as every line of the log is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_port_was_taken_meanwhile_moves_and_the_services_naming_it_follow() {
    let mut system = System::start().await;
    system.app.add_product("MUG", 100, 10).await;
    let before = system.url("checkout");
    let port: u16 = before
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("checkout's port");
    system.kill("checkout").await;
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).expect("take checkout's port");
    system.launch("checkout").await;
    let checkout = system.url("checkout");
    assert_ne!(checkout, before, "checkout moved");
    // The attempt that found its port taken said why in a JSON line of its
    // log, as every other line is.
    let log = std::fs::read_to_string(system.dir().join("checkout.log")).expect("checkout's log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "ERROR"
            && l["service"] == "checkout"
            && l.to_string().contains("Address already in use")),
        "the reason checkout stopped, as a JSON line: {log}"
    );
    place_one_mug(&system, "moved").await;
    let app = &system.app;
    eventually("the order to be paid", Duration::from_secs(30), || async {
        (app.count("SELECT count(*) FROM orders WHERE state = 'confirmed'")
            .await
            == 1)
            .then_some(())
    })
    .await;
    // psp-sim's webhook reached checkout at its new address.
    eventually(
        "a webhook at checkout's new port",
        Duration::from_secs(30),
        || async {
            let text = reqwest::get(format!("{checkout}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let received: f64 = text
                .lines()
                .filter(|l| l.starts_with("soldonce_webhooks_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            (received >= 1.0).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_each_service_in_turn_during_load_loses_no_order_and_no_event() {
    let mut system = System::start().await;
    system.app.add_product("MUG", 100, 100_000).await;
    let checkout = system.url("checkout");
    let (client, token) = (system.app.client.clone(), system.app.token.clone());
    let running = Arc::new(AtomicBool::new(true));
    let load = {
        let running = running.clone();
        tokio::spawn(async move {
            let mut accepted = HashSet::new();
            while running.load(Ordering::Relaxed) {
                let batch: Vec<Option<String>> = stream::iter(0..20)
                    .map(|_| {
                        let (client, token, checkout) =
                            (client.clone(), token.clone(), checkout.clone());
                        async move {
                            // One key per order, retried until checkout answers: a restart must not lose it.
                            let key = Uuid::new_v4().to_string();
                            let body =
                                serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] });
                            for _ in 0..600 {
                                let sent = client
                                    .post(format!("{checkout}/v1/orders"))
                                    .bearer_auth(&token)
                                    .header("idempotency-key", &key)
                                    .json(&body)
                                    .send()
                                    .await;
                                if let Ok(r) = sent {
                                    if r.status().as_u16() == 202 {
                                        let v: serde_json::Value = r.json().await.ok()?;
                                        return v["id"].as_str().map(str::to_owned);
                                    }
                                }
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            None
                        }
                    })
                    .buffer_unordered(20)
                    .collect()
                    .await;
                accepted.extend(batch.into_iter().flatten());
            }
            accepted
        })
    };
    for service in SERVICES {
        let code = system.terminate(service).await;
        assert_eq!(
            code,
            Some(0),
            "{service} drains and exits cleanly on SIGTERM; its log:\n{}",
            system.log_tail(service)
        );
        system.launch(service).await;
    }
    running.store(false, Ordering::Relaxed);
    let accepted = load.await.expect("load");
    assert!(accepted.len() > 50, "the load ran: {}", accepted.len());
    let app = &system.app;
    let js = bus::connect(&system.nats.url()).await.expect("nats");
    eventually("the system to settle", Duration::from_secs(90), || {
        let js = js.clone();
        async move {
            let busy = app
                .count(
                    "SELECT (SELECT count(*) FROM orders WHERE state = 'payment_pending') + (SELECT count(*) FROM outbox) \
                          + (SELECT count(*) FROM orders o WHERE o.state = 'confirmed' AND NOT EXISTS \
                               (SELECT 1 FROM shipments s WHERE s.order_id = o.id AND s.state = 'delivered')) \
                          + (SELECT count(*) FROM orders WHERE capture IN ('authorized', 'decided'))",
                )
                .await;
            let events = app.count("SELECT count(*) FROM events").await;
            (busy == 0 && soldonce_tests::relay::stream_len(&js).await == u64::try_from(events).unwrap_or(0)).then_some(())
        }
    })
    .await;
    for id in &accepted {
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM orders WHERE id = '{id}' AND state = 'confirmed'"
            ))
            .await,
            1,
            "order {id}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        accepted.len() as i64,
        "no order without a 202"
    );
    let ids: Vec<(Uuid,)> = sqlx::query_as("SELECT event_id FROM events")
        .fetch_all(&app.pool)
        .await
        .expect("events");
    let stream = read_stream(&system.nats.url()).await;
    assert_eq!(
        stream.keys().copied().collect::<HashSet<_>>(),
        ids.into_iter().map(|r| r.0).collect(),
        "every event published once"
    );
    assert_audit_clean(app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soldonce_up_then_demo_flash_sale_sells_the_unit_once_and_ships_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = localservers::free_port().expect("port");
    let mut up = tokio::process::Command::new(binary("soldonce"))
        .args(["up", "--data-dir"])
        .arg(dir.path())
        .args(["--checkout-addr", &format!("127.0.0.1:{port}")])
        .env(
            "CONSOLE_ADDR",
            format!("127.0.0.1:{}", localservers::free_port().expect("port")),
        )
        .env_remove("CONSOLE_TOKEN")
        .env_remove("DATABASE_URL")
        .env_remove("NATS_URL")
        .env_remove("TOKIO_WORKER_THREADS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("soldonce up");
    let env_file = dir.path().join("env");
    let env_text = eventually("soldonce up to be ready", Duration::from_secs(120), || {
        let env_file = env_file.clone();
        async move { std::fs::read_to_string(env_file).ok() }
    })
    .await;
    let vars: Vec<(String, String)> = env_text
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect();
    let demo = tokio::process::Command::new(binary("soldonce"))
        .args([
            "--json",
            "demo",
            "flash-sale",
            "--buyers",
            "100",
            "--stock",
            "1",
        ])
        .envs(vars)
        .output()
        .await
        .expect("demo");
    let text = String::from_utf8_lossy(&demo.stdout);
    assert_eq!(
        demo.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON summary");
    assert_eq!(
        (summary["accepted"].as_u64(), summary["sold_out"].as_u64()),
        (Some(1), Some(99)),
        "{summary}"
    );
    assert_eq!(
        (summary["paid"].as_i64(), summary["shipped"].as_i64()),
        (Some(1), Some(1)),
        "{summary}"
    );
    assert_eq!(
        (summary["audit_clean"].as_bool(), summary["ok"].as_bool()),
        (Some(true), Some(true)),
        "{summary}"
    );
    // up serves the console too, behind the token it wrote to the env file.
    let var = |name: &str| {
        env_text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}='")))
            .map(|v| v.trim_end_matches('\'').to_owned())
            .unwrap_or_else(|| panic!("{name} in the env file"))
    };
    let client = reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .expect("http client");
    let figures = client
        .get(format!("{}api/figures", var("CONSOLE_URL")))
        .bearer_auth(var("CONSOLE_TOKEN"))
        .send()
        .await
        .expect("the console answers");
    assert_eq!(figures.status(), 200);
    let figures: serde_json::Value = figures.json().await.expect("figures");
    assert_eq!(figures["orders"]["confirmed"], 1, "{figures}");
    // up gives each service its share of the cores: with the six services,
    // PostgreSQL and NATS on this machine, cores / 8 threads, at least one.
    let metrics = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("checkout's metrics")
        .text()
        .await
        .expect("text");
    let share = (platform::runtime::cores() / 8).max(1);
    assert!(
        metrics
            .lines()
            .any(|l| l == format!("soldonce_runtime_workers {share}")),
        "checkout runs {share} worker thread(s) under up:\n{metrics}"
    );
    let pid = up.id().expect("pid");
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let exit = tokio::time::timeout(Duration::from_secs(60), up.wait())
        .await
        .expect("up stops")
        .expect("wait");
    assert_eq!(exit.code(), Some(0), "up stops everything on SIGTERM");
}

/// The pid of `parent`'s child process named `name`, from /proc.
fn child_named(parent: u32, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // pid (comm) state ppid …
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent && comm == name).then_some(pid)
        })
}

#[test]
fn soldonce_up_refuses_an_unknown_service_in_only_before_it_creates_or_starts_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = std::process::Command::new(binary("soldonce"))
        .args(["up", "--only", "checkout,shipping", "--data-dir"])
        .arg(&data)
        .env_remove("DATABASE_URL")
        .env_remove("NATS_URL")
        .output()
        .expect("soldonce up");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
    assert!(
        said.contains("--only: unknown service \"shipping\""),
        "names what it refused: {said}"
    );
    assert!(!data.exists(), "nothing created: no {}", data.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soldonce_up_names_a_service_that_dies_and_stops_the_rest_with_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = localservers::free_port().expect("port");
    let log = dir.path().join("up.log");
    let mut up = tokio::process::Command::new(binary("soldonce"))
        .args(["up", "--only", "checkout,outbox-relay", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--checkout-addr", &format!("127.0.0.1:{port}")])
        .env_remove("DATABASE_URL")
        .env_remove("NATS_URL")
        .env_remove("LOG_FORMAT")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("soldonce up");
    let env_file = dir.path().join("data").join("env");
    eventually("soldonce up to be ready", Duration::from_secs(120), || {
        let env_file = env_file.clone();
        async move { env_file.exists().then_some(()) }
    })
    .await;
    let up_pid = up.id().expect("up runs");
    let relay = child_named(up_pid, "outbox-relay").expect("up started outbox-relay");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &relay.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = eventually("up to stop", Duration::from_secs(30), || {
        let status = up.try_wait().expect("wait for up");
        async move { status }
    })
    .await;
    let said = std::fs::read_to_string(&log).expect("up's log");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("up: outbox-relay exited"),
        "up names the service that died: {said}"
    );
    // Its services log text for the person watching, not JSON.
    assert!(
        said.lines()
            .any(|l| l.starts_with("[checkout] ") && l.contains("telemetry ready format=text")),
        "checkout logs text under up: {said}"
    );
    assert!(
        child_named(up_pid, "checkout").is_none(),
        "checkout was stopped too"
    );
    assert!(
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_err(),
        "nothing answers on checkout's port"
    );
}

/// Places one MUG through checkout instance `instance` with `token`: the status.
async fn place_via(system: &System, instance: &str, token: &str, key: &str) -> u16 {
    system.place(instance, token, key, "MUG").await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_by_every_checkout_within_5_s_and_a_rotated_one_works_at_once() {
    let system = System::start_with(SystemOptions {
        instances: vec![("checkout", 2)],
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("MUG", 100, 100).await;
    let token = system.app.token.clone();
    // Both checkouts have the token in their cache.
    for (n, instance) in ["checkout", "checkout#2"].iter().enumerate() {
        assert_eq!(
            place_via(&system, instance, &token, &format!("before-{n}")).await,
            202
        );
    }
    let env = [("DATABASE_URL", system.app.database_url.as_str())];
    let account = system.app.account_id.to_string();
    let (code, said) = soldonce_tests::relay::soldonce(&["account", "revoke", &account], &env);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("\"tokens_revoked\":1"), "{said}");
    let revoked_at = std::time::Instant::now();
    // Asked with a read (a placement accepted within the cache's bound would add an order).
    for instance in ["checkout", "checkout#2"] {
        let url = format!("{}/v1/orders?limit=1", system.url(instance));
        eventually("the revoked token refused", Duration::from_secs(5), || {
            let request = system.app.client.get(&url).bearer_auth(&token);
            async move {
                let status = request.send().await.ok()?.status();
                (status == 401).then_some(())
            }
        })
        .await;
    }
    assert!(revoked_at.elapsed() <= Duration::from_secs(5));
    for (n, instance) in ["checkout", "checkout#2"].iter().enumerate() {
        assert_eq!(
            place_via(&system, instance, &token, &format!("after-{n}")).await,
            401
        );
    }
    // Counted in the rows: the two orders before, none after.
    assert_eq!(system.app.count("SELECT count(*) FROM orders").await, 2);

    let (code, said) = soldonce_tests::relay::soldonce(&["account", "rotate", &account], &env);
    assert_eq!(code, Some(0), "{said}");
    let rotated: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    let fresh = rotated["token"].as_str().expect("a new token");
    for (n, instance) in ["checkout", "checkout#2"].iter().enumerate() {
        assert_eq!(
            place_via(&system, instance, fresh, &format!("rotated-{n}")).await,
            202
        );
        assert_eq!(
            place_via(&system, instance, &token, &format!("old-{n}")).await,
            401
        );
    }
    assert_eq!(system.app.count("SELECT count(*) FROM orders").await, 4);
    // Bad input: one line, exit 2, nothing changed.
    let (code, said) = soldonce_tests::relay::soldonce(&["account", "revoke", "nobody"], &env);
    assert_eq!(code, Some(2), "{said}");
    let (code, said) = soldonce_tests::relay::soldonce(
        &["account", "revoke", &uuid::Uuid::nil().to_string()],
        &env,
    );
    assert_eq!((code, said.trim().lines().count()), (Some(2), 1), "{said}");
    let tokens = format!("SELECT count(*) FROM api_tokens WHERE account_id = '{account}'");
    assert_eq!(system.app.count(&tokens).await, 1, "only the rotated token");
}
