//! A webhook's event type must agree with the status it carries: one that
//! contradicts itself is refused with 400, its receipt kept, nothing else
//! changed.

use soldonce_tests::app::Reply;
use soldonce_tests::app::{Buckets, WEBHOOK_SECRET};
use soldonce_tests::TestApp;

/// Delivers a signed webhook of `event_type` saying `status` about `order_id`'s payment.
async fn deliver(app: &TestApp, id: &str, event_type: &str, status: &str, order_id: &str) -> Reply {
    let body = serde_json::json!({ "type": event_type, "timestamp": chrono::Utc::now(), "data": {
        "id": "pay_types", "status": status, "amount_minor": 2500, "currency": "BRL", "reference": order_id,
        "idempotency_key": format!("pay:{order_id}"), "payment_id": "pay_types", "failure_reason": null,
        "created_at": chrono::Utc::now(), "refunds": [] } })
    .to_string();
    let ts = chrono::Utc::now().timestamp();
    let secret = psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret");
    let signature = psp_sim::signature::sign(&secret, id, ts, body.as_bytes());
    app.send(
        app.client
            .post(app.url("/v1/psp/webhooks"))
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body),
    )
    .await
}

#[tokio::test]
async fn a_webhook_whose_status_contradicts_its_type_is_400_and_changes_nothing() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 5).await;
    let placed = app.buy("MUG", 1).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let order_id = placed.body["id"].as_str().expect("id").to_owned();
    let contradictions = [
        ("msg_refunded_ok", "payment.refunded", "succeeded"),
        ("msg_failed_ok", "payment.failed", "succeeded"),
        ("msg_refund_failed", "refund.succeeded", "failed"),
    ];
    for (id, event_type, status) in contradictions {
        for delivery in 0..2 {
            let reply = deliver(&app, id, event_type, status, &order_id).await;
            reply.assert_problem(400);
            assert_eq!(
                reply.body["type"], "urn:soldonce:problem:webhook-type-mismatch",
                "{event_type}/{status}, delivery {delivery}"
            );
        }
    }
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_receipts").await,
        3,
        "each refused webhook's receipt is kept, once"
    );
    for (what, sql) in [
        ("payments", "SELECT count(*) FROM payments"),
        ("foreign payments", "SELECT count(*) FROM foreign_payments"),
        (
            "events",
            "SELECT count(*) FROM events WHERE type <> 'order.placed.v1'",
        ),
    ] {
        assert_eq!(app.count(sql).await, 0, "a refused webhook wrote {what}");
    }
    let order = app.get(&app.token, &format!("/v1/orders/{order_id}")).await;
    assert_eq!(order.body["state"], "payment_pending", "{}", order.body);
    let held = Buckets {
        available: 4,
        reserved: 1,
        sold: 0,
    };
    assert_eq!(app.buckets("MUG").await, held);
    // A webhook that agrees with itself is still applied.
    let agreed = deliver(&app, "msg_ok", "payment.succeeded", "succeeded", &order_id).await;
    assert_eq!(agreed.status, 200, "{}", agreed.body);
    let order = app.get(&app.token, &format!("/v1/orders/{order_id}")).await;
    assert_eq!(order.body["state"], "confirmed", "{}", order.body);
    assert_eq!(app.buckets("MUG").await.sold, 1);
}
