//! Payments that are `processing` first: they settle by themselves after `processing_ms`, as
//! the decline roll at creation decided, and only then announce themselves.

use psp_sim::model::{FailureReason, Payment, PaymentStatus, Refund};
use psp_sim::webhook::EventType;
use psp_sim::Faults;
use serde_json::{json, Value};

use crate::support::{eventually, payment_body, problem, settled, Receiver, TestApp};

fn processing(processing_ms: u64) -> Faults {
    Faults {
        processing_rate: 1.0,
        processing_ms,
        ..Faults::default()
    }
}

#[tokio::test]
async fn a_processing_payment_settles_by_itself_and_only_then_sends_its_webhook() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(processing(2000), Some(&receiver)).await;
    let body = payment_body(1990, "ord_processing");

    let response = app.pay("pay:ord_processing", &body).await;
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    assert_eq!(created["status"], "processing");
    assert_eq!(created["failure_reason"], Value::Null);
    let created: Payment = serde_json::from_value(created).unwrap();
    // While it processes, every way of asking says so.
    let again = app.pay("pay:ord_processing", &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Payment>().await.unwrap(), created);
    let by_id: Payment = app
        .client
        .get(app.url(&format!("/v1/payments/{}", created.id)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_id, created);
    assert_eq!(
        app.payment_by_key("pay:ord_processing").await,
        Some(created.clone())
    );

    let payment = settled(&app, "pay:ord_processing").await;

    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(
        (&payment.id, payment.created_at),
        (&created.id, created.created_at)
    );
    let deliveries = receiver.wait_for(1).await;
    let payload = deliveries[0].payload();
    assert_eq!(payload.event_type, EventType::PaymentSucceeded);
    assert_eq!(
        serde_json::from_value::<Payment>(payload.data).unwrap(),
        payment
    );
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"processing\"}")
            .await,
        1
    );
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"succeeded\"}")
            .await,
        1
    );
    // Settled, it is an ordinary payment: it can be refunded.
    let refund = app.refund(&payment.id, "refund:ord_processing", None).await;
    assert_eq!(refund.status(), 201);
    assert_eq!(refund.json::<Refund>().await.unwrap().amount_minor, 1990);
}

#[tokio::test]
async fn a_payment_still_processing_has_sent_no_webhook_and_cannot_be_refunded() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(processing(600_000), Some(&receiver)).await;
    let pending: Payment = app
        .pay("pay:ord_pending", &payment_body(500, "ord_pending"))
        .await
        .json()
        .await
        .unwrap();

    let response = app.refund(&pending.id, "refund:ord_pending", None).await;

    let refused = problem(response, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-processing"
    );
    assert!(refused.detail.contains(&pending.id), "{}", refused.detail);
    let pending = app.payment_by_key("pay:ord_pending").await.unwrap();
    assert_eq!(pending.status, PaymentStatus::Processing);
    assert!(pending.refunds.is_empty());
    // A webhook the pending payment had sent would have been queued before this one's.
    app.put_faults(&json!({})).await;
    app.pay("pay:ord_marker", &payment_body(1, "ord_marker"))
        .await;
    eventually("the marker's webhook to be acknowledged", async || {
        (app.metric("psp_sim_webhooks_total{outcome=\"acknowledged\"}")
            .await
            == 1)
            .then_some(())
    })
    .await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].payload().data["reference"], "ord_marker");
}

#[tokio::test]
async fn a_declined_processing_payment_settles_as_failed_and_announces_that() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        decline_rate: 1.0,
        ..processing(50)
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    let created: Payment = app
        .pay("pay:ord_slow_no", &payment_body(700, "ord_slow_no"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(created.status, PaymentStatus::Processing);
    assert_eq!(created.failure_reason, None);

    let payment = settled(&app, "pay:ord_slow_no").await;

    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_reason, Some(FailureReason::CardDeclined));
    let deliveries = receiver.wait_for(1).await;
    let payload = deliveries[0].payload();
    assert_eq!(payload.event_type, EventType::PaymentFailed);
    assert_eq!(payload.data["failure_reason"], "card_declined");
    let refund = app.refund(&payment.id, "refund:ord_slow_no", None).await;
    let refused = problem(refund, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-refundable"
    );
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"decline\"}")
            .await,
        1
    );
}
