//! The operator console (`soldonce console`): during a demo flash sale a
//! real browser (headless Chromium) loads the page with the operator token,
//! and the figures it shows match the database; without the token the data
//! stays shut. `CONSOLE_SCREENSHOT=path` keeps the run's screenshot (the
//! README's picture comes from such a run).

use soldonce_tests::relay::binary;
use soldonce_tests::system::System;
use soldonce_tests::{eventually, poll};
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

const TOKEN: &str = "console-operator-token-for-tests-0123456789";

fn chromium() -> String {
    for candidate in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return candidate.to_owned();
        }
    }
    panic!("no Chromium on PATH (install Debian's chromium: . deploy/setup.sh)");
}

/// Chromium, headless, on `url` with `extra` flags; returns its stdout.
fn browse(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("browser profile");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1366,1000",
            // Time for the scripts to fetch the figures and draw them.
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `data-figure` the rendered page shows: name → text.
fn shown(dom: &str) -> HashMap<String, String> {
    let mut figures = HashMap::new();
    for piece in dom.split("data-figure=\"").skip(1) {
        let Some((name, rest)) = piece.split_once('"') else {
            continue;
        };
        let Some(text) = rest.split_once('>').and_then(|(_, r)| r.split_once('<')) else {
            continue;
        };
        figures.insert(name.to_owned(), text.0.trim().to_owned());
    }
    figures
}

fn number(text: &str) -> i64 {
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_live_flash_sale_as_the_database_has_it_and_only_to_the_operator() {
    let system = System::start().await;
    system.app.add_product("FLASH-TEE", 2_500, 400).await;
    let port = localservers::free_port().expect("port");
    let console_url = format!("http://127.0.0.1:{port}");
    let _console = tokio::process::Command::new(binary("soldonce"))
        .arg("console")
        .env("DATABASE_URL", &system.app.database_url)
        .env("NATS_URL", system.nats.url())
        .env("CONSOLE_TOKEN", TOKEN)
        .env("CONSOLE_ADDR", format!("127.0.0.1:{port}"))
        .env("CONSOLE_AUDIT_INTERVAL", "1s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the console");
    poll::ready("console", &format!("{console_url}/healthz")).await;

    // No token, a wrong one, and a console started with a weak one.
    for auth in [None, Some("Bearer not-the-operator-token-at-all-000000")] {
        let mut request = system.app.client.get(format!("{console_url}/api/figures"));
        if let Some(a) = auth {
            request = request.header("Authorization", a);
        }
        let refused = system.app.send(request).await;
        refused.assert_problem(401);
    }
    let (code, text) = soldonce_tests::relay::soldonce(
        &["console"],
        &[
            ("DATABASE_URL", system.app.database_url.as_str()),
            ("CONSOLE_TOKEN", "short"),
        ],
    );
    assert_eq!(code, Some(2), "{text}");
    assert_eq!(text.trim().lines().count(), 1, "one clear line: {text}");
    assert!(text.contains("CONSOLE_TOKEN"), "{text}");

    // The flash sale: 800 buyers over 8 s for 400 tee-shirts.
    let load = tokio::process::Command::new(binary("soldonce"))
        .args([
            "--json",
            "load",
            "--rate",
            "100/s",
            "--duration",
            "8s",
            "--sku",
            "FLASH-TEE",
        ])
        .env("CHECKOUT_URL", system.url("checkout"))
        .env("SOLDONCE_TOKEN", &system.app.token)
        .env("DATABASE_URL", &system.app.database_url)
        .kill_on_drop(true)
        .output();
    let load = tokio::spawn(load);
    eventually("the sale under way", Duration::from_secs(30), || async {
        (system.app.count("SELECT count(*) FROM orders").await >= 250).then_some(())
    })
    .await;
    let page = format!("{console_url}/#token={TOKEN}");
    let screenshot = tempfile::tempdir().expect("screenshot dir");
    let png = screenshot.path().join("console.png");
    {
        let (page, png) = (page.clone(), png.clone());
        tokio::task::spawn_blocking(move || {
            browse(&page, &[&format!("--screenshot={}", png.display())])
        })
        .await
        .expect("screenshot");
    }
    let bytes = std::fs::read(&png).expect("a screenshot was written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "a real picture"
    );
    if let Some(keep) = std::env::var_os("CONSOLE_SCREENSHOT") {
        std::fs::copy(&png, keep).expect("keep the screenshot");
    }
    // The console charts the sale as it happens: placements per second,
    // sampled from the event store.
    let request = system
        .app
        .client
        .get(format!("{console_url}/api/figures"))
        .bearer_auth(TOKEN);
    let live = system.app.send(request).await;
    assert_eq!(live.status, 200, "{}", live.body);
    let placed_per_second: f64 = live.body["rates"]
        .as_array()
        .expect("rates")
        .iter()
        .filter_map(|r| r["per_second"]["order.placed"].as_f64())
        .fold(0.0, f64::max);
    assert!(
        placed_per_second > 10.0,
        "the chart shows the sale: {}",
        live.body["rates"]
    );
    let out = load.await.expect("load task").expect("soldonce load");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Once the sale has settled, what the page shows is what the rows say.
    eventually("the sale settled", Duration::from_secs(60), || async {
        let pending = system
            .app
            .count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
            .await;
        let outbox = system.app.count("SELECT count(*) FROM outbox").await;
        (pending == 0 && outbox == 0).then_some(())
    })
    .await;
    let dom = tokio::task::spawn_blocking(move || browse(&page, &["--dump-dom"]))
        .await
        .expect("dump the page");
    let figures = shown(&dom);
    assert!(
        dom.contains("data-updated="),
        "the page drew the figures: {dom}"
    );
    for state in [
        "payment_pending",
        "confirmed",
        "payment_failed",
        "cancelled",
        "expired",
        "refunded",
    ] {
        let rows = system
            .app
            .count(&format!(
                "SELECT count(*) FROM orders WHERE state = '{state}'"
            ))
            .await;
        let on_page = figures
            .get(&format!("orders.{state}"))
            .unwrap_or_else(|| panic!("the page shows {state}: {figures:?}"));
        assert_eq!(number(on_page), rows, "orders {state}");
    }
    let buckets = system.app.buckets("FLASH-TEE").await;
    assert_eq!(buckets.sold, 400, "the sale sold out");
    for (bucket, rows) in [
        ("available", buckets.available),
        ("reserved", buckets.reserved),
        ("sold", buckets.sold),
    ] {
        let on_page = &figures[&format!("stock.FLASH-TEE.{bucket}")];
        assert_eq!(number(on_page), rows, "FLASH-TEE {bucket}");
    }
    assert_eq!(number(&figures["outbox.rows"]), 0);
    assert_eq!(number(&figures["dead_letters.total"]), 0);
    assert_eq!(
        figures["audit.violations"], "0",
        "the audit ran and is clean"
    );
    assert!(
        figures.contains_key("consumers.payment-worker"),
        "{figures:?}"
    );
}
