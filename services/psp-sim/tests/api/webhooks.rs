//! Webhooks: signed per Standard Webhooks, retried until acknowledged, and the webhook faults.

use psp_sim::model::Payment;
use psp_sim::signature::{sign, verify};
use psp_sim::webhook::EventType;
use psp_sim::Faults;
use serde_json::json;

use crate::support::{eventually, payment_body, secret, Delivery, Receiver, TestApp};

fn assert_signed(delivery: &Delivery) {
    let id = delivery.header("webhook-id");
    let timestamp: i64 = delivery.header("webhook-timestamp").parse().unwrap();
    let signature = delivery.header("webhook-signature");
    assert!(verify(&secret(), id, timestamp, &delivery.body, signature));
    assert_eq!(sign(&secret(), id, timestamp, &delivery.body), signature);
    let age = chrono::Utc::now().timestamp() - timestamp;
    assert!(
        (0..60).contains(&age),
        "timestamp {timestamp} is {age} s old"
    );
}

async fn acknowledged(app: &TestApp, count: u64) {
    eventually(&format!("{count} acknowledged webhooks"), async || {
        (app.metric("psp_sim_webhooks_total{outcome=\"acknowledged\"}")
            .await
            == count)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn webhooks_arrive_signed_and_verifiable() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let payment: Payment = app
        .pay("pay:ord_hook", &payment_body(1990, "ord_hook"))
        .await
        .json()
        .await
        .unwrap();

    let deliveries = receiver.wait_for(1).await;

    let delivery = &deliveries[0];
    assert_signed(delivery);
    assert!(delivery.header("webhook-id").starts_with("msg_"));
    assert_eq!(delivery.header("content-type"), "application/json");
    let payload = delivery.payload();
    assert_eq!(payload.event_type, EventType::PaymentSucceeded);
    assert_eq!(
        serde_json::from_value::<Payment>(payload.data).unwrap(),
        payment
    );
}

#[tokio::test]
async fn declines_and_refunds_announce_themselves() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let paid: Payment = app
        .pay("k-ok", &payment_body(100, "ord_events"))
        .await
        .json()
        .await
        .unwrap();
    let refund = app.refund(&paid.id, "r", None).await;
    assert_eq!(refund.status(), 201);
    app.put_faults(&json!({ "decline_rate": 1.0 })).await;
    app.pay("k-no", &payment_body(100, "ord_events")).await;

    let deliveries = receiver.wait_for(3).await;

    let mut types: Vec<String> = deliveries
        .iter()
        .map(|d| d.payload().event_type.to_string())
        .collect();
    types.sort();
    assert_eq!(
        types,
        ["payment.failed", "payment.succeeded", "refund.succeeded"]
    );
    deliveries.iter().for_each(assert_signed);
}

#[tokio::test]
async fn three_duplicates_share_one_webhook_id() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        webhook_duplicates: 3,
        ..Faults::default()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    app.pay("pay:ord_dup", &payment_body(100, "ord_dup")).await;

    acknowledged(&app, 3).await;

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 3);
    let id = deliveries[0].header("webhook-id");
    assert!(deliveries
        .iter()
        .all(|d| d.header("webhook-id") == id && d.body == deliveries[0].body));
    deliveries.iter().for_each(assert_signed);
}

#[tokio::test]
async fn a_receiver_answering_500_first_gets_a_retry() {
    let receiver = Receiver::start(1).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    app.pay("pay:ord_retry", &payment_body(100, "ord_retry"))
        .await;

    acknowledged(&app, 1).await;

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[0].answered, 500);
    assert!(deliveries[1].answered.is_success());
    assert_eq!(
        deliveries[0].header("webhook-id"),
        deliveries[1].header("webhook-id")
    );
    assert_eq!(deliveries[0].body, deliveries[1].body);
    deliveries.iter().for_each(assert_signed);
    assert_eq!(
        app.metric("psp_sim_webhook_attempts_total{result=\"failed\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_replayed_payment_sends_no_second_webhook() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let body = payment_body(100, "ord_replay_hook");
    app.pay("pay:ord_replay_hook", &body).await;
    app.pay("pay:ord_replay_hook", &body).await;
    app.pay("pay:ord_other", &payment_body(100, "ord_other"))
        .await;

    acknowledged(&app, 2).await;

    let mut references: Vec<String> = receiver
        .deliveries()
        .iter()
        .map(|d| d.payload().data["reference"].as_str().unwrap().to_owned())
        .collect();
    references.sort();
    assert_eq!(references, ["ord_other", "ord_replay_hook"]);
}

#[tokio::test]
async fn a_dropped_webhook_never_arrives() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        drop_webhook_rate: 1.0,
        ..Faults::default()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    app.pay("pay:ord_dropped", &payment_body(100, "ord_dropped"))
        .await;

    eventually("the drop to be counted", async || {
        (app.metric("psp_sim_faults_injected_total{fault=\"drop_webhook\"}")
            .await
            == 1)
            .then_some(())
    })
    .await;

    // The drop is decided before any delivery task exists, so none can still be on its way.
    assert!(receiver.deliveries().is_empty());
}

#[tokio::test]
async fn reordered_webhooks_arrive_newest_first() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        webhook_reorder: true,
        ..Faults::default()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    for reference in ["ord_a", "ord_b", "ord_c"] {
        app.pay(&format!("pay:{reference}"), &payment_body(100, reference))
            .await;
    }

    let deliveries = receiver.wait_for(3).await;

    let arrived: Vec<String> = deliveries
        .iter()
        .map(|d| d.payload().data["reference"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(arrived, ["ord_c", "ord_b", "ord_a"]);
}

#[tokio::test]
async fn a_payments_webhook_continues_the_trace_its_charge_came_with() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let response = app
        .client
        .post(app.url("/v1/payments"))
        .header("Idempotency-Key", "pay:ord_traced")
        .header("traceparent", sent)
        .json(&payment_body(500, "ord_traced"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    // And one without a trace (or with an invalid one): a fresh, valid trace.
    app.client
        .post(app.url("/v1/payments"))
        .header("Idempotency-Key", "pay:ord_untraced")
        .header("traceparent", "00-not-a-trace-01")
        .json(&payment_body(500, "ord_untraced"))
        .send()
        .await
        .unwrap();

    let deliveries = receiver.wait_for(2).await;
    let by_reference = |reference: &str| {
        deliveries
            .iter()
            .find(|d| d.payload().data["reference"] == reference)
            .map(|d| d.header("traceparent").to_owned())
            .expect("a webhook for the payment")
    };
    let traced = by_reference("ord_traced");
    assert!(
        traced.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{traced}"
    );
    assert_ne!(traced, sent, "one hop on: a new parent id");
    assert!(
        platform::trace::TraceParent::parse(&traced).is_some(),
        "{traced}"
    );
    let untraced = by_reference("ord_untraced");
    let parsed = platform::trace::TraceParent::parse(&untraced).expect("a valid traceparent");
    assert_ne!(parsed.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
}

/// Every change of status sends exactly the webhook of its new status, once: a manual payment
/// held, captured, refunded and disputed; another held then canceled; a third awaiting the
/// buyer. Replays of each change send nothing more.
#[tokio::test]
async fn each_change_sends_the_one_webhook_of_its_new_status() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let kept = app.pay_manual("ord_kept", 1000).await;
    app.capture(&kept.id, "cap", None).await;
    app.capture(&kept.id, "cap", None).await;
    app.refund(&kept.id, "re", Some(json!({ "amount_minor": 100 })))
        .await;
    app.dispute(&kept.id, Some(json!({ "amount_minor": 100 })))
        .await;
    let voided = app.pay_manual("ord_voided", 1000).await;
    app.cancel(&voided.id, "void").await;
    app.cancel(&voided.id, "void").await;
    app.put_faults(&json!({ "action_required_rate": 1.0 }))
        .await;
    app.pay("pay:ord_waiting", &payment_body(1, "ord_waiting"))
        .await;

    acknowledged(&app, 7).await;

    let mut types: Vec<String> = receiver
        .deliveries()
        .iter()
        .map(|d| d.payload().event_type.to_string())
        .collect();
    types.sort();
    assert_eq!(
        types,
        [
            "dispute.created",
            "payment.canceled",
            "payment.requires_action",
            "payment.requires_capture",
            "payment.requires_capture",
            "payment.succeeded",
            "refund.succeeded",
        ]
    );
    receiver.deliveries().iter().for_each(assert_signed);
}
