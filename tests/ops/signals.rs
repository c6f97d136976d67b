//! What operators read from a running service: its metrics, each family
//! with a `# HELP` line (its meaning, declared once beside the code that
//! records it) and money labelled with its currency; its log lines, JSON
//! naming the service unless told `LOG_FORMAT=text`.

use platform::metric::Metric;
use soldonce_tests::eventually;
use soldonce_tests::system::{System, SystemOptions, SERVICES};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// The families of a Prometheus text exposition that have samples or a
/// `# TYPE` line but no `# HELP` line.
fn families_without_help(text: &str) -> BTreeSet<String> {
    let described: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP ")?.split(' ').next())
        .collect();
    let mut families: BTreeMap<&str, &str> = BTreeMap::new();
    for line in text.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let mut parts = typed.split(' ');
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                families.insert(name, kind);
            }
        }
    }
    let mut missing: BTreeSet<String> = families
        .keys()
        .filter(|name| !described.contains(*name))
        .map(|name| (*name).to_owned())
        .collect();
    // A sample of no declared family (histograms add _bucket, _sum, _count).
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|base| families.contains_key(base))
            .unwrap_or(name);
        if !described.contains(family) {
            missing.insert(family.to_owned());
        }
    }
    missing
}

/// `promtool check metrics` on a scrape: it parses, and Prometheus's own
/// linter finds nothing (a missing HELP, a counter without `_total`, …).
fn promtool_check_metrics(service: &str, text: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (install Debian's prometheus: . deploy/setup.sh)")
        });
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("write the scrape to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "{service}: promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// And, once an order has flowed, every family has a `# HELP` line and the
/// whole scrape passes `promtool check metrics`.
async fn every_services_metrics_parse_and_describe_every_family() {
    // Every service runs on one runtime thread unless told otherwise (the
    // harness sets it, as `soldonce up` and compose do); checkout is told 3.
    let system = System::start_with(SystemOptions {
        env: vec![("checkout", "TOKIO_WORKER_THREADS", "3".to_owned())],
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("MUG", 100, 10).await;
    for service in SERVICES {
        let text = reqwest::get(format!("{}/metrics", system.url(service)))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text");
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines)
            .unwrap_or_else(|e| panic!("{service}: {e}\n{text}"));
        assert!(
            !scrape.samples.is_empty() || text.trim().is_empty(),
            "{service}: {text}"
        );
        if *service != "psp-sim" {
            let workers = scrape
                .samples
                .iter()
                .find(|s| s.metric == "soldonce_runtime_workers")
                .map(|s| match s.value {
                    prometheus_parse::Value::Gauge(v) => v,
                    ref other => panic!("{service}: the worker count is a gauge: {other:?}"),
                })
                .unwrap_or_else(|| panic!("{service}: no soldonce_runtime_workers in\n{text}"));
            let expected = if *service == "checkout" { 3.0 } else { 1.0 };
            assert_eq!(workers, expected, "{service}: runtime worker threads");
        }
    }
    // After an order flows, the saga's metrics are there to see.
    let placed = system
        .place("checkout", &system.app.token, "m1", "MUG")
        .await;
    assert_eq!(placed.status, 202);
    eventually("the order to be paid", Duration::from_secs(30), || async {
        (system
            .app
            .count("SELECT count(*) FROM orders WHERE state = 'confirmed'")
            .await
            == 1)
            .then_some(())
    })
    .await;
    let scraped = |service: &'static str| {
        let url = format!("{}/metrics", system.url(service));
        async move {
            reqwest::get(url)
                .await
                .expect("scrape")
                .text()
                .await
                .expect("text")
        }
    };
    assert!(scraped("checkout")
        .await
        .contains("soldonce_checkout_requests_total"));
    let relay = scraped("outbox-relay").await;
    assert!(relay.contains("soldonce_outbox_published_total"));
    // The relay's lag comes in two parts, on the fine steps of its 25 ms budget:
    // every acknowledged row was claimed first.
    let count = |name: &str| {
        soldonce_tests::metric_sample(&relay, name).unwrap_or_else(|| panic!("{name} in\n{relay}"))
    };
    let acked = count("soldonce_outbox_commit_to_puback_seconds_count");
    assert!(acked >= 1.0, "{relay}");
    assert!(
        count("soldonce_outbox_commit_to_claim_seconds_count") >= acked,
        "{relay}"
    );
    assert!(relay.contains("soldonce_outbox_commit_to_claim_seconds_bucket{le=\"0.0125\"}"));
    assert!(scraped("payment-worker")
        .await
        .contains("soldonce_psp_latency_seconds"));
    // The standard signals: which build runs, and each request by route template.
    for service in SERVICES.iter().filter(|s| **s != "psp-sim") {
        let build = format!(
            "soldonce_build_info{{service=\"{service}\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(
            scraped(service).await.contains(&build),
            "{service}: {build}"
        );
    }
    let checkout = scraped("checkout").await;
    let placed = checkout
        .lines()
        .find(|l| {
            l.starts_with("http_server_request_duration_seconds_count{")
                && l.contains("http_route=\"/v1/orders\"")
                && l.contains("http_request_method=\"POST\"")
                && l.contains("http_response_status_code=\"202\"")
        })
        .unwrap_or_else(|| panic!("POST /v1/orders 202 in\n{checkout}"));
    assert!(placed.ends_with(" 1"), "one order placed: {placed}");
    assert!(
        !checkout.contains("http_route=\"/v1/orders/0"),
        "routes are templates, not paths"
    );
    // Money is counted with its currency: the MUG's price, in BRL.
    let worker = scraped("payment-worker").await;
    assert_eq!(
        soldonce_tests::metric_sample(
            &worker,
            "soldonce_payments_authorized_minor_total{currency=\"BRL\"}"
        ),
        Some(100.0),
        "{worker}"
    );
    for service in SERVICES {
        let text = scraped(service).await;
        let undescribed = families_without_help(&text);
        assert!(
            undescribed.is_empty(),
            "{service}: no # HELP for {undescribed:?}: declare each in its crate's METRICS (metric_help.rs)\n{text}"
        );
        promtool_check_metrics(service, &text);
    }
}

/// Every metric name a string literal gives one of the `metrics` crate's
/// recording macros in `source`, even when the name is on the next line.
fn recorded_names(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for mac in ["counter!(", "gauge!(", "histogram!("] {
        for after in source.split(mac).skip(1) {
            let after = after.trim_start();
            if let Some(literal) = after.strip_prefix('"') {
                if let Some(end) = literal.find('"') {
                    names.insert(literal[..end].to_owned());
                }
            }
        }
    }
    names
}

/// What the sources record is what the crates declare, and what the
/// reference names: a metric recorded and not declared would have no
/// `# HELP` (and the scrape above sees only the metrics one order touches);
/// one declared and never recorded is stale.
#[test]
fn every_metric_the_services_record_is_declared_and_in_the_reference() {
    let lists: [(&str, &[Metric]); 9] = [
        ("platform", platform::metric::METRICS),
        ("store", store::METRICS),
        ("bus", bus::METRICS),
        ("checkout", checkout::METRICS),
        ("outbox-relay", outbox_relay::METRICS),
        ("payment-worker", payment_worker::METRICS),
        ("payments", payments::METRICS),
        ("expiry", expiry::METRICS),
        ("fulfillment", fulfillment::METRICS),
    ];
    let mut declared: BTreeMap<&str, &str> = BTreeMap::new();
    for (krate, list) in lists {
        for metric in list {
            if let Some(other) = declared.insert(metric.name, krate) {
                panic!(
                    "{} is declared in {other} and in {krate}: keep one",
                    metric.name
                );
            }
            assert!(
                metric.help.ends_with('.') && !metric.help.contains('\n'),
                "{}: its help is one sentence: {:?}",
                metric.name,
                metric.help
            );
        }
    }
    let services = Path::new(env!("CARGO_MANIFEST_DIR")).join("../services");
    let mut recorded = BTreeMap::new();
    for file in super::alerts::walk(&services) {
        if file.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&file).expect("source");
            for name in recorded_names(&source) {
                recorded
                    .entry(name)
                    .or_insert_with(|| file.display().to_string());
            }
        }
    }
    assert!(
        recorded.len() >= 40,
        "the scan finds the metrics: {recorded:?}"
    );
    let undeclared: Vec<String> = recorded
        .iter()
        .filter(|(name, _)| !declared.contains_key(name.as_str()))
        .map(|(name, file)| format!("{name} (recorded in {file})"))
        .collect();
    assert!(
        undeclared.is_empty(),
        "recorded without a declaration (add each to its crate's METRICS in metric_help.rs, with its meaning): {undeclared:?}"
    );
    let stale: Vec<&&str> = declared
        .keys()
        .filter(|name| !recorded.contains_key(**name))
        .collect();
    assert!(
        stale.is_empty(),
        "declared but recorded nowhere (remove them from METRICS): {stale:?}"
    );
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md"))
            .expect("docs/reference.md");
    let unreferenced: Vec<&&str> = declared
        .keys()
        .filter(|name| !reference.contains(&format!("`{name}")))
        .collect();
    assert!(
        unreferenced.is_empty(),
        "add these to docs/reference.md's Metrics table: {unreferenced:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_logs_json_lines_that_name_it() {
    let env = SERVICES
        .iter()
        .flat_map(|s| {
            [
                (*s, "LOG_FORMAT", "json".to_owned()),
                (*s, "RUST_LOG", "info".to_owned()),
            ]
        })
        .collect();
    let system = System::start_with(SystemOptions {
        env,
        ..SystemOptions::default()
    })
    .await;
    for service in SERVICES {
        let path = system.dir().join(format!("{service}.log"));
        // Whole lines only: one may be half written as it is read.
        let lines = eventually(
            &format!("{service} to log a line"),
            Duration::from_secs(30),
            || {
                let path = path.clone();
                async move {
                    let text = std::fs::read_to_string(path).ok()?;
                    let (whole, _) = text.rsplit_once('\n')?;
                    Some(whole.to_owned())
                }
            },
        )
        .await;
        for line in lines.lines().filter(|l| !l.trim().is_empty()) {
            let parsed: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{service}: a line that is not JSON ({e}): {line}"));
            assert_eq!(parsed["service"], *service, "{service}: {line}");
        }
        assert!(
            lines.contains("telemetry ready"),
            "{service}: its first line: {lines}"
        );
    }
}
