//! Canceling (voiding) a payment before its money is taken: once per key, like Stripe refusing
//! a second cancel under a new key while replaying the first under the same one.

use psp_sim::model::{CancellationReason, Payment, PaymentStatus};
use psp_sim::webhook::EventType;
use psp_sim::Faults;
use serde_json::json;

use crate::changes::ok;
use crate::support::{payment_body, problem, Receiver, TestApp};

#[tokio::test]
async fn a_held_payment_is_canceled_as_requested_and_announced() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let held = app.pay_manual("ord_void", 700).await;

    let canceled = ok(app.cancel(&held.id, "void:1").await).await;

    assert_eq!(canceled.status, PaymentStatus::Canceled);
    assert_eq!(
        canceled.cancellation_reason,
        Some(CancellationReason::Requested)
    );
    assert_eq!(canceled.amount_captured, 0);
    assert_eq!(app.payment(&held.id).await, canceled);
    let deliveries = receiver.wait_for(2).await;
    let announced: Vec<Payment> = deliveries
        .iter()
        .filter(|d| d.payload().event_type == EventType::PaymentCanceled)
        .map(|d| serde_json::from_value(d.payload().data).unwrap())
        .collect();
    assert_eq!(announced, [canceled]);
    assert_eq!(
        app.metric("psp_sim_cancellations_total{reason=\"requested\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_second_cancel_with_a_new_key_gets_409_and_the_same_key_replays() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_twice", 700).await;
    let first = ok(app.cancel(&held.id, "void:first").await).await;

    let refused = problem(app.cancel(&held.id, "void:second").await, 409).await;
    let replayed = ok(app.cancel(&held.id, "void:first").await).await;

    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-cancelable"
    );
    assert!(refused.detail.contains("is canceled"), "{}", refused.detail);
    assert_eq!(replayed, first);
    assert_eq!(
        app.metric("psp_sim_cancellations_total{reason=\"requested\"}")
            .await,
        1
    );
    assert_eq!(
        app.metric("psp_sim_idempotent_replays_total{resource=\"cancel\"}")
            .await,
        1
    );
    // A canceled payment took nothing: nothing to capture or refund.
    let capture = problem(app.capture(&held.id, "cap:late", None).await, 409).await;
    assert_eq!(
        capture.problem_type,
        "urn:psp-sim:problem:payment-not-capturable"
    );
    let refund = problem(app.refund(&held.id, "re:late", None).await, 409).await;
    assert_eq!(
        refund.problem_type,
        "urn:psp-sim:problem:payment-not-refundable"
    );
    // The cancel key is its own: using it to capture is a reuse.
    let reuse = problem(app.capture(&held.id, "void:first", None).await, 422).await;
    assert_eq!(
        reuse.problem_type,
        "urn:psp-sim:problem:idempotency-key-reused"
    );
}

#[tokio::test]
async fn final_and_processing_payments_cannot_be_canceled() {
    let app = TestApp::spawn().await;
    let paid: Payment = app
        .pay("pay:paid", &payment_body(100, "ord_paid"))
        .await
        .json()
        .await
        .unwrap();
    let refused = problem(app.cancel(&paid.id, "void:paid").await, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-cancelable"
    );
    assert!(
        refused.detail.contains("is succeeded"),
        "{}",
        refused.detail
    );

    app.put_faults(&json!({ "decline_rate": 1.0 })).await;
    let failed = app.pay_manual("ord_failed", 100).await;
    assert_eq!(failed.status, PaymentStatus::Failed);
    let refused = problem(app.cancel(&failed.id, "void:failed").await, 409).await;
    assert!(refused.detail.contains("is failed"), "{}", refused.detail);

    app.put_faults(&json!({ "processing_rate": 1.0, "processing_ms": 600_000 }))
        .await;
    let pending = app.pay_manual("ord_pending", 100).await;
    let refused = problem(app.cancel(&pending.id, "void:pending").await, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-processing"
    );
    assert_eq!(
        app.payment(&pending.id).await.status,
        PaymentStatus::Processing
    );
    let unknown = problem(app.cancel("pay_unknown", "void:unknown").await, 404).await;
    assert_eq!(
        unknown.problem_type,
        "urn:psp-sim:problem:payment-not-found"
    );
}

#[tokio::test]
async fn a_cancel_takes_no_body_fields_and_needs_a_key() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_void_body", 100).await;

    let body = Some(json!({ "cancellation_reason": "duplicate" }));
    let refused = problem(app.change(&held.id, "cancel", "void:body", body).await, 422).await;
    assert!(
        refused.detail.contains("cancellation_reason"),
        "{}",
        refused.detail
    );
    let no_key = app
        .client
        .post(app.url(&format!("/v1/payments/{}/cancel", held.id)))
        .send()
        .await
        .unwrap();
    let refused = problem(no_key, 400).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:idempotency-key-missing"
    );

    assert_eq!(
        app.payment(&held.id).await.status,
        PaymentStatus::RequiresCapture
    );
    let canceled = ok(app
        .change(&held.id, "cancel", "void:empty", Some(json!({})))
        .await)
    .await;
    assert_eq!(canceled.status, PaymentStatus::Canceled);
}
