//! Due is decided on the database's clock: an expiry process whose host
//! clock runs fast releases nothing early, and one bad order never holds
//! back the rest of its batch.

use super::{assert_released_once, place_many, wait_past_windows};
use soldonce_tests::relay::binary;
use soldonce_tests::{eventually, metric_sample, TestApp};
use std::sync::Arc;
use std::time::Duration;

/// The expiry binary run under `faketime`, its clock `offset` away (e.g.
/// `+5m`), releasing every 100 ms; returns it and its `/metrics` URL.
fn expiry_with_clock(database_url: &str, offset: &str) -> (tokio::process::Child, String) {
    let port = localservers::free_port().expect("port");
    let child = tokio::process::Command::new("faketime")
        .args(["-f", offset])
        .arg(binary("expiry"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", database_url)
        .env("EXPIRY_ADDR", format!("127.0.0.1:{port}"))
        .env("EXPIRY_INTERVAL", "100ms")
        .env("AUDIT_INTERVAL", "0")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("faketime is installed (deploy/setup.sh installs it)");
    (child, format!("http://127.0.0.1:{port}/metrics"))
}

/// Waits until the expiry behind `metrics` has run `runs` more release rounds.
async fn wait_runs(metrics: &str, runs: f64) -> f64 {
    let read = || async {
        let text = reqwest::get(metrics).await.ok()?.text().await.ok()?;
        metric_sample(&text, "soldonce_expiry_runs_total")
    };
    let start = eventually("expiry to serve its metrics", Duration::from_secs(30), read).await;
    eventually(
        "expiry to run its rounds",
        Duration::from_secs(30),
        || async { read().await.filter(|n| *n >= start + runs) },
    )
    .await
}

/// The expiry host's clock is 5 minutes fast; reservations last 2
/// minutes: none is released. A reservation of 1 s, placed after, is
/// released by the same process: it does run, on the database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_under_a_clock_five_minutes_fast_releases_nothing_early() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(120)).await);
    app.add_product("CLOCK", 100, 50).await;
    place_many(&app, "CLOCK", 20).await;
    let (_expiry, metrics) = expiry_with_clock(&app.database_url, "+5m");
    wait_runs(&metrics, 10.0).await;
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
            .await,
        20,
        "no reservation released before its window passed"
    );
    assert_eq!(app.buckets("CLOCK").await.reserved, 20);

    let short = TestApp::spawn_on(app.database_url.clone(), Duration::from_secs(1)).await;
    let r = short.buy_retrying("CLOCK", 1).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    short
        .wait_count(
            "the short reservation released",
            &format!("SELECT count(*) FROM orders WHERE id = '{id}' AND state = 'expired'"),
            1,
        )
        .await;
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
            .await,
        20
    );
    // The event carries the database's time, not the fast host's.
    let late: i64 = app
        .count("SELECT count(*) FROM events WHERE type = 'order.expired.v1' AND recorded_at > now() + interval '1 minute'")
        .await;
    assert_eq!(
        late, 0,
        "the expired event is stamped on the database's clock"
    );
}

/// One order whose row cannot be decoded and a SKU whose reserved units
/// were edited below what its orders hold: both are set aside and named,
/// and every other overdue order of their batches is released, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_order_or_a_short_stock_row_is_set_aside_and_the_batch_goes_on() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(1)).await);
    for sku in ["GOOD", "BROKEN", "SHORT"] {
        app.add_product(sku, 100, 50).await;
    }
    let good = place_many(&app, "GOOD", 10).await;
    let broken = place_many(&app, "BROKEN", 3).await;
    place_many(&app, "SHORT", 4).await;
    sqlx::query("UPDATE orders SET shipping = '[1, 2]' WHERE id = $1::uuid")
        .bind(&broken[0])
        .execute(&app.pool)
        .await
        .expect("corrupt one order");
    sqlx::query("UPDATE stock SET held = 1 WHERE sku = 'SHORT'")
        .execute(&app.pool)
        .await
        .expect("short the stock row");
    wait_past_windows(&app).await;

    let aside = expiry::SetAside::default();
    // One batch holds them all: the bad rows must not fail it.
    let released = expiry::release_overdue(&app.pool, 100, 1, &aside)
        .await
        .expect("the batch is released");
    assert_eq!(
        released,
        12,
        "10 GOOD and the 2 readable BROKEN orders; set aside: {:?}",
        aside.orders()
    );
    let mut set_aside = aside.orders();
    set_aside.sort();
    assert_eq!(
        set_aside.len(),
        5,
        "the corrupt order and the 4 SHORT orders"
    );
    assert!(set_aside.iter().any(|id| id.to_string() == broken[0]));
    assert_released_once(&app, 12).await;
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM orders WHERE state = 'expired' AND id::text IN ('{}')",
            good.join("','")
        ))
        .await,
        10
    );
    assert_eq!(app.buckets("GOOD").await.available, 50);
    // A second run claims only what is left, and sets nothing aside again.
    let again = expiry::release_overdue(&app.pool, 100, 1, &aside)
        .await
        .expect("second run");
    assert_eq!(again, 0);
    assert_eq!(aside.orders().len(), 5);
}
