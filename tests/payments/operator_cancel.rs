//! An operator cancels a confirmed order before its goods leave, through
//! the admin API or `soldonce order cancel`: the units go back on sale, the
//! shipment stops, the authorization is voided (or the money taken
//! refunded) exactly once — counted at psp-sim and in soldonce's own rows.

use soldonce_tests::app::{Reply, ADMIN_TOKEN};
use soldonce_tests::eventually;
use soldonce_tests::relay::binary;
use soldonce_tests::saga::{assert_audit_clean, Saga, SagaOptions};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

async fn cancel(saga: &Saga, order: &str, token: &str, body: &str) -> Reply {
    let request = saga
        .app
        .client
        .post(saga.app.url(&format!("/admin/v1/orders/{order}/cancel")))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_owned());
    saga.app.send(request).await
}

/// `soldonce order cancel ORDER ARGS…`: its exit code, stdout and stderr.
fn cli_cancel(saga: &Saga, order: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(binary("soldonce"))
        .args(["order", "cancel", order])
        .args(args)
        .env("DATABASE_URL", &saga.app.database_url)
        .output()
        .expect("run soldonce order cancel");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// MUG's buckets: available, reserved, sold.
async fn buckets(saga: &Saga) -> (i64, i64, i64) {
    sqlx::query_as("SELECT available, reserved, sold FROM stock_buckets WHERE sku = 'MUG'")
        .fetch_one(&saga.app.pool)
        .await
        .expect("stock")
}

async fn count_events(saga: &Saga, order: &str, kind: &str) -> i64 {
    saga.app
        .count(&format!(
            "SELECT count(*) FROM events WHERE type = '{kind}' AND (stream_id = '{order}' OR data->>'order_id' = '{order}')"
        ))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_shipment_voids_the_authorization_once_and_puts_the_units_back() {
    let mut saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 5).await;
    // The warehouse takes an hour a step: the shipment waits, pending.
    saga.start_fulfillment(Duration::from_secs(3600)).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
    saga.app
        .wait_count(
            "the shipment made",
            &format!(
                "SELECT count(*) FROM shipments WHERE order_id = '{id}' AND state = 'pending'"
            ),
            1,
        )
        .await;
    assert_eq!(buckets(&saga).await, (4, 0, 1));

    let first = cancel(
        &saga,
        &id,
        ADMIN_TOKEN,
        r#"{"reason": "address undeliverable"}"#,
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["outcome"], "cancelled", "{}", first.body);
    assert_eq!(first.body["money"]["void"], true, "{}", first.body);
    assert_eq!(first.body["money"]["amount_minor"], 2500, "{}", first.body);
    // Again, through either door, and with no body: nothing new.
    let again = cancel(&saga, &id, ADMIN_TOKEN, "").await;
    assert_eq!(
        (again.status, again.body["outcome"].as_str()),
        (200, Some("already_cancelled")),
        "{}",
        again.body
    );
    let (code, out, err) = cli_cancel(&saga, &id, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancelled already"), "{out}");

    // At the PSP: the one authorization canceled on soldonce's request, nothing captured.
    let payment = eventually("the void at the PSP", SETTLE, || async {
        let payments = saga.psp_payments(&id).await;
        let [p] = &payments[..] else { return None };
        (p["status"] == "canceled").then(|| p.clone())
    })
    .await;
    assert_eq!(payment["cancellation_reason"], "requested", "{payment}");
    assert_eq!(
        payment["amount_captured"].as_i64().unwrap_or(0),
        0,
        "{payment}"
    );
    saga.app
        .wait_count(
            "the void recorded",
            "SELECT count(*) FROM operator_refunds WHERE void AND state = 'succeeded'",
            1,
        )
        .await;
    // In soldonce's rows: the unit back on sale, the shipment stopped, each event once.
    assert_eq!(
        buckets(&saga).await,
        (5, 0, 0),
        "the unit is for sale again"
    );
    assert_eq!(
        saga.app
            .count(&format!(
                "SELECT count(*) FROM stock_ledger WHERE order_id = '{id}' AND movement = 'restock' AND d_available = 1 AND d_sold = -1"
            ))
            .await,
        1
    );
    assert_eq!(
        saga.app
            .count(&format!(
                "SELECT count(*) FROM shipments WHERE order_id = '{id}' AND state = 'cancelled'"
            ))
            .await,
        1
    );
    for kind in [
        "order.operator_cancelled.v1",
        "order.operator_refund_decided.v1",
        "order.operator_refunded.v1",
        "shipment.cancelled.v1",
    ] {
        assert_eq!(count_events(&saga, &id, kind).await, 1, "{kind}");
    }
    let view = saga
        .app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await;
    assert_eq!(view.body["state"], "cancelled", "{}", view.body);
    assert_eq!(view.body["payment"]["state"], "voided", "{}", view.body);
    assert_eq!(
        view.body["refunds"][0]["reason"], "operator_cancel",
        "{}",
        view.body
    );
    assert_eq!(view.body["refunds"][0]["state"], "voided", "{}", view.body);
    // The freed unit sells again.
    let next = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&next, SETTLE).await, "confirmed");
    assert_audit_clean(&saga.app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_refunds_what_operators_left_and_a_shipped_order_cannot_be_cancelled() {
    let mut saga = Saga::start_with(SagaOptions {
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
    let part = saga
        .app
        .send(
            saga.app
                .client
                .post(saga.app.url(&format!("/admin/v1/orders/{id}/refunds")))
                .bearer_auth(ADMIN_TOKEN)
                .json(&serde_json::json!({"key": "ticket-1", "amount_minor": 1000})),
        )
        .await;
    assert_eq!(part.status, 201, "{}", part.body);

    // Bad input changes nothing: a reason too long, a buyer's token, not an id.
    let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(201));
    let refused = cancel(&saga, &id, ADMIN_TOKEN, &long).await;
    assert_eq!(
        (refused.status, refused.body["field"].as_str()),
        (422, Some("reason")),
        "{}",
        refused.body
    );
    let buyer = cancel(&saga, &id, &saga.app.token, "").await;
    assert_eq!(buyer.status, 401, "{}", buyer.body);
    let (code, _, err) = cli_cancel(&saga, "not-an-order", &[]);
    assert_eq!((code, err.trim().lines().count()), (2, 1), "{err}");
    assert_eq!(
        count_events(&saga, &id, "order.operator_cancelled.v1").await,
        0
    );

    let (code, out, err) = cli_cancel(&saga, &id, &["--reason", "customer called", "--by", "ana"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1500"), "the refund of what was left: {out}");
    let refunds = eventually("both refunds at the PSP", SETTLE, || async {
        let payments = saga.psp_payments(&id).await;
        let [p] = &payments[..] else { return None };
        let mut amounts: Vec<i64> = p["refunds"]
            .as_array()?
            .iter()
            .filter(|r| r["status"] == "succeeded")
            .filter_map(|r| r["amount_minor"].as_i64())
            .collect();
        amounts.sort_unstable();
        (amounts.len() == 2).then_some(amounts)
    })
    .await;
    assert_eq!(refunds, [1000, 1500], "the whole payment back, never more");
    saga.app
        .wait_count(
            "both refunds recorded",
            &format!("SELECT count(*) FROM operator_refunds WHERE order_id = '{id}' AND state = 'succeeded' AND NOT void"),
            2,
        )
        .await;
    assert_eq!(buckets(&saga).await, (5, 0, 0));

    // An order whose goods left: refused through either door, nothing changed.
    saga.start_fulfillment(Duration::from_millis(50)).await;
    let shipped = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&shipped, SETTLE).await, "confirmed");
    saga.app
        .wait_count(
            "the second order delivered",
            &format!("SELECT count(*) FROM shipments WHERE order_id = '{shipped}' AND state = 'delivered'"),
            1,
        )
        .await;
    let late = cancel(&saga, &shipped, ADMIN_TOKEN, "").await;
    assert_eq!(late.status, 409, "{}", late.body);
    assert!(
        late.body["detail"]
            .as_str()
            .unwrap_or("")
            .contains("goods have left"),
        "{}",
        late.body
    );
    let (code, _, err) = cli_cancel(&saga, &shipped, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("goods have left"), "{err}");
    assert_eq!(
        buckets(&saga).await,
        (4, 0, 1),
        "the shipped unit stays sold"
    );
    assert_eq!(
        count_events(&saga, &shipped, "order.operator_cancelled.v1").await,
        0
    );
    saga.wait_quiescent(SETTLE).await;
    assert_audit_clean(&saga.app).await;
}
