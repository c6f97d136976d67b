//! Payments charged exactly once against a provider that fails in every way real ones do.

use futures::stream::{self, StreamExt};
use soldonce_tests::app::Buckets;
use soldonce_tests::saga::Saga;
use std::collections::HashMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_psp_failing_the_first_two_calls_still_confirms_with_exactly_one_payment() {
    let saga = Saga::start(r#"{"fail_first": 2}"#, Duration::from_secs(2)).await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(
        saga.settled_state(&id, Duration::from_secs(30)).await,
        "confirmed"
    );
    let payments = saga.psp_payments(&id).await;
    assert_eq!(payments.len(), 1, "exactly one charge: {payments:?}");
    assert_eq!(payments[0]["amount_minor"], 2500);
    assert_eq!(
        saga.faults_injected("fail_first").await,
        2.0,
        "both first calls failed"
    );
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
    let order = saga
        .app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await;
    assert_eq!(order.body["payment"]["psp_payment_id"], payments[0]["id"]);
    assert_eq!(order.body["payment"]["amount_minor"], 2500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_fails_the_order_and_returns_the_units() {
    let saga = Saga::start(r#"{"decline_rate": 1.0}"#, Duration::from_secs(2)).await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(
        saga.settled_state(&id, Duration::from_secs(30)).await,
        "payment_failed"
    );
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 5,
            reserved: 0,
            sold: 0
        }
    );
    assert_eq!(
        saga.app.ledger("MUG").await,
        saga.app.buckets("MUG").await,
        "ledger balanced"
    );
    assert_eq!(saga.psp_payments(&id).await.len(), 1);
    assert_eq!(
        saga.faults_injected("decline").await,
        1.0,
        "the PSP declined it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_lost_after_the_charge_still_ends_confirmed_with_one_payment() {
    let saga = Saga::start(r#"{"lose_reply_rate": 1.0}"#, Duration::from_millis(500)).await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(
        saga.settled_state(&id, Duration::from_secs(30)).await,
        "confirmed"
    );
    assert_eq!(
        saga.psp_payments(&id).await.len(),
        1,
        "never charged again with a new key"
    );
    assert!(
        saga.faults_injected("lose_reply").await >= 1.0,
        "the charge's reply was lost"
    );
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_delivered_three_times_out_of_order_have_one_effect_each() {
    let saga = Saga::start(
        r#"{"webhook_duplicates": 3, "webhook_reorder": true}"#,
        Duration::from_secs(2),
    )
    .await;
    saga.app.add_product("MUG", 2500, 50).await;
    let mut ids = vec![];
    for _ in 0..20 {
        ids.push(saga.order("MUG").await);
    }
    for id in &ids {
        assert_eq!(
            saga.settled_state(id, Duration::from_secs(30)).await,
            "confirmed"
        );
    }
    // Every copy of every webhook has arrived once psp-sim saw 20 × 3
    // deliveries answered 2xx.
    soldonce_tests::eventually(
        "every copy of every webhook to be acknowledged",
        Duration::from_secs(30),
        || async {
            (saga
                .psp_metric(r#"psp_sim_webhook_attempts_total{result="acknowledged"}"#)
                .await
                >= 60.0)
                .then_some(())
        },
    )
    .await;
    // Each of the 20 payments' webhooks was sent twice more, and some batch newest first.
    saga.fault_fired("duplicate_webhook", 40.0).await;
    saga.fault_fired("reorder_webhooks", 1.0).await;
    // A copy that learned something keeps a receipt (its repeats are then
    // duplicates); a copy of a payment already recorded is answered from a
    // read and keeps none. So at most one receipt per webhook id.
    let receipts = saga
        .app
        .count("SELECT count(*) FROM webhook_receipts")
        .await;
    assert!(receipts <= 20, "{receipts} receipts for 20 webhook ids");
    assert_eq!(
        saga.app
            .count("SELECT count(DISTINCT webhook_id) FROM webhook_receipts")
            .await,
        receipts
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM payments WHERE disposition = 'attached'")
            .await,
        20,
        "one payment attached per order"
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM stock_ledger WHERE movement = 'confirm'")
            .await,
        20,
        "one confirm each"
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.confirmed.v1'")
            .await,
        20
    );
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 30,
            reserved: 0,
            sold: 20
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_orders_with_declines_lost_replies_and_duplicate_webhooks_all_end_consistently()
{
    let faults = r#"{"decline_rate": 0.2, "lose_reply_rate": 0.1, "webhook_duplicates": 2}"#;
    let saga = Saga::start(faults, Duration::from_millis(500)).await;
    saga.app.add_product("MUG", 100, 2_000).await;
    let ids: Vec<String> = stream::iter(0..1_000)
        .map(|_| saga.order("MUG"))
        .buffer_unordered(50)
        .collect()
        .await;
    let started = std::time::Instant::now();
    soldonce_tests::eventually(
        "every order to be terminal",
        Duration::from_secs(60),
        || async {
            (saga
                .app
                .count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
                .await
                == 0)
                .then_some(())
        },
    )
    .await;
    let settled_in = started.elapsed();
    let confirmed = saga
        .app
        .count("SELECT count(*) FROM orders WHERE state = 'confirmed'")
        .await;
    let failed = saga
        .app
        .count("SELECT count(*) FROM orders WHERE state = 'payment_failed'")
        .await;
    assert_eq!(confirmed + failed, 1_000, "every order confirmed or failed");
    assert!(failed > 100 && failed < 300, "about 20% declined: {failed}");
    assert_eq!(
        saga.faults_injected("decline").await,
        failed as f64,
        "one decline at the PSP per failed order"
    );
    saga.fault_fired("lose_reply", 1.0).await;
    saga.fault_fired("duplicate_webhook", 1.0).await;
    let sold_lines = saga
        .app
        .count("SELECT coalesce(sum(l.quantity), 0)::bigint FROM order_lines l JOIN orders o ON o.id = l.order_id WHERE o.state = 'confirmed'")
        .await;
    let b = saga.app.buckets("MUG").await;
    assert_eq!(b.sold, sold_lines, "sold = confirmed lines");
    assert_eq!((b.reserved, b.available + b.sold), (0, 2_000));
    let mut succeeded = 0;
    let mut per_order: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        let payments = saga.psp_payments(id).await;
        per_order.insert(id.clone(), payments.len());
        succeeded += payments
            .iter()
            // Authorized (captured when it ships: no fulfillment runs here) or taken.
            .filter(|p| p["status"] == "requires_capture" || p["status"] == "succeeded")
            .count();
    }
    assert!(
        per_order.values().all(|n| *n == 1),
        "no order charged twice"
    );
    assert_eq!(
        succeeded as i64, confirmed,
        "PSP authorizations = confirmed orders"
    );
    eprintln!("1,000 orders settled {settled_in:?} after the last was placed: {confirmed} confirmed, {failed} failed");
}

/// A payment's confirmation moves its units from reserved to sold without
/// the SKU's `stock` row, the row checkout moves: while another
/// transaction holds that row locked (as checkout's transactions do, one
/// after another, on a hot SKU), the order is confirmed all the same. The
/// buckets then agree with the ledger, and the audit is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_confirmed_while_checkout_holds_its_skus_stock_row() {
    let mut saga = Saga::start_with(soldonce_tests::saga::SagaOptions {
        worker: false,
        ..Default::default()
    })
    .await;
    saga.app.add_product("HOT", 1000, 5).await;
    let id = saga.order("HOT").await;
    let mut holder = saga.app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM stock WHERE sku = 'HOT' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .expect("lock the stock row");
    saga.start_worker().await;
    assert_eq!(
        saga.settled_state(&id, Duration::from_secs(30)).await,
        "confirmed",
        "confirmed with the stock row still locked"
    );
    holder.rollback().await.expect("release the row");
    assert_eq!(
        saga.app.buckets("HOT").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
    let (available, reserved, sold): (i64, i64, i64) = sqlx::query_as(
        "SELECT sum(d_available)::bigint, sum(d_reserved)::bigint, sum(d_sold)::bigint \
         FROM stock_ledger WHERE sku = 'HOT'",
    )
    .fetch_one(&saga.app.pool)
    .await
    .expect("ledger");
    assert_eq!((available, reserved, sold), (4, 0, 1), "the ledger's sums");
    soldonce_tests::saga::assert_audit_clean(&saga.app).await;
}
