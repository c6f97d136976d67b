//! Webhooks of payments already recorded are answered from looks asked
//! together, and write nothing. Counted on a checkout process of the
//! test's own: the looks' counters of an in-process checkout are the whole
//! test process's, where every concurrent test's webhooks add to them.

use super::webhooks::{payment_success_body, signed};
use soldonce_tests::app::WEBHOOK_SECRET;
use soldonce_tests::relay::binary;
use soldonce_tests::{eventually, TestApp};
use std::time::Duration;

/// checkout as a process of its own over the test's database: its
/// `/metrics` count only what this test sends it.
struct CheckoutProcess {
    url: String,
    _child: tokio::process::Child,
}

impl CheckoutProcess {
    async fn start(database_url: &str) -> CheckoutProcess {
        let port = localservers::free_port().expect("port");
        let child = tokio::process::Command::new(binary("checkout"))
            .env("DATABASE_URL", database_url)
            .env("CHECKOUT_ADDR", format!("127.0.0.1:{port}"))
            .env("WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start checkout");
        let url = format!("http://127.0.0.1:{port}");
        soldonce_tests::poll::ready("checkout", &format!("{url}/readyz")).await;
        CheckoutProcess { url, _child: child }
    }

    /// One counter of this checkout's `/metrics`.
    async fn counter(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.url))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text");
        soldonce_tests::metric_sample(&text, name)
            .unwrap_or_else(|| panic!("{name} is not in checkout's metrics:\n{text}"))
    }
}

#[tokio::test]
async fn webhooks_of_recorded_payments_are_answered_from_looks_asked_together_and_write_nothing() {
    const ORDERS: usize = 20;
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, ORDERS as i64).await;
    let mut orders = vec![];
    for _ in 0..ORDERS {
        let placed = app.buy("MUG", 1).await;
        assert_eq!(placed.status, 202, "{}", placed.body);
        orders.push(placed.body["id"].as_str().expect("id").to_owned());
    }
    let checkout = CheckoutProcess::start(&app.database_url).await;
    let hook = |webhook_id: String, i: usize| {
        let body = payment_success_body(&format!("pay_{i}"), &orders[i], 2500);
        let ts = chrono::Utc::now().timestamp();
        let signature = signed(WEBHOOK_SECRET, &webhook_id, ts, &body);
        app.client
            .post(format!("{}/v1/psp/webhooks", checkout.url))
            .header("webhook-id", webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body)
    };
    // Each payment learned from its first webhook (no worker runs here).
    for i in 0..ORDERS {
        assert_eq!(
            app.send(hook(format!("msg_first_{i}"), i)).await.status,
            200
        );
    }
    let recorded = [
        "SELECT count(*) FROM payments WHERE disposition = 'attached'",
        "SELECT count(*) FROM orders WHERE state = 'confirmed'",
        "SELECT count(*) FROM webhook_receipts",
        "SELECT count(*) FROM events",
    ];
    let mut before = vec![];
    for sql in recorded {
        before.push(app.count(sql).await);
    }
    assert_eq!(
        before[..3],
        [ORDERS as i64; 3],
        "every first webhook was learned"
    );
    let looks = checkout.counter("soldonce_webhook_looks_total").await;
    let statements = checkout
        .counter("soldonce_webhook_look_statements_total")
        .await;

    // The payments table locked: the first look waits on it, and every
    // other webhook's look queues behind it until the lock is released.
    let mut holder = app.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE payments IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .expect("lock payments");
    let again =
        futures::future::join_all((0..ORDERS).map(|i| app.send(hook(format!("msg_again_{i}"), i))));
    let release = async {
        eventually(
            "the webhooks' looks all queued",
            Duration::from_secs(20),
            || async {
                (checkout.counter("soldonce_webhook_looks_total").await >= looks + ORDERS as f64)
                    .then_some(())
            },
        )
        .await;
        holder.rollback().await.expect("release payments");
    };
    let (answers, ()) = tokio::join!(again, release);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, 200, "webhook {i}: {}", answer.body);
    }
    // Two ways: the webhooks' looks were asked in at most two statements
    // (the one that waited for the lock, and one for all the rest), and
    // nothing was written for any of them.
    assert_eq!(
        checkout.counter("soldonce_webhook_looks_total").await - looks,
        ORDERS as f64,
        "each webhook found its payment at its first look"
    );
    let asked = checkout
        .counter("soldonce_webhook_look_statements_total")
        .await
        - statements;
    assert!(
        (1.0..=2.0).contains(&asked),
        "{ORDERS} looks took {asked} statements"
    );
    for (sql, was) in recorded.iter().zip(before) {
        assert_eq!(
            app.count(sql).await,
            was,
            "a webhook of a recorded payment wrote: {sql}"
        );
    }
}
