//! Disputes: the buyer's bank takes captured money back (`POST /admin/payments/{id}/dispute`),
//! announced by `dispute.created`; disputed money can no longer be refunded.

use psp_sim::model::{Dispute, DisputeReason, DisputeStatus, Payment, Refund};
use psp_sim::webhook::EventType;
use psp_sim::Faults;
use serde_json::json;

use crate::support::{payment_body, problem, Receiver, TestApp};

async fn paid(app: &TestApp, reference: &str, amount_minor: i64) -> Payment {
    let response = app
        .pay(
            &format!("pay:{reference}"),
            &payment_body(amount_minor, reference),
        )
        .await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

#[tokio::test]
async fn a_dispute_is_announced_and_limits_what_can_be_refunded() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let payment = paid(&app, "ord_chargeback", 1000).await;
    let first: Refund = app
        .refund(&payment.id, "re:1", Some(json!({ "amount_minor": 200 })))
        .await
        .json()
        .await
        .unwrap();

    let response = app
        .dispute(
            &payment.id,
            Some(json!({ "amount_minor": 500, "reason": "fraudulent" })),
        )
        .await;

    assert_eq!(response.status(), 201);
    let dispute: Dispute = response.json().await.unwrap();
    assert!(
        dispute.id.starts_with("dp_") && dispute.id.len() == 35,
        "{}",
        dispute.id
    );
    assert_eq!(dispute.payment_id, payment.id);
    assert_eq!(dispute.amount_minor, 500);
    assert_eq!(dispute.reason, DisputeReason::Fraudulent);
    assert_eq!(dispute.status, DisputeStatus::NeedsResponse);
    assert_eq!(
        app.payment(&payment.id).await.disputes,
        std::slice::from_ref(&dispute)
    );
    let deliveries = receiver.wait_for(3).await;
    let announced: Vec<Dispute> = deliveries
        .iter()
        .filter(|d| d.payload().event_type == EventType::DisputeCreated)
        .map(|d| serde_json::from_value(d.payload().data).unwrap())
        .collect();
    assert_eq!(announced, [dispute]);
    // 1000 captured − 200 refunded − 500 disputed: 300 left to refund.
    let over = app
        .refund(&payment.id, "re:2", Some(json!({ "amount_minor": 301 })))
        .await;
    let refused = problem(over, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:refund-exceeds-remaining"
    );
    let rest: Refund = app
        .refund(&payment.id, "re:3", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(rest.amount_minor, 300);
    let after = app.payment(&payment.id).await;
    assert_eq!(after.refunds, [first, rest]);
    assert_eq!(app.metric("psp_sim_disputes_total").await, 1);
}

#[tokio::test]
async fn a_dispute_without_a_body_takes_all_that_is_left_then_nothing_is() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_dispute_all", 800).await;
    app.refund(&payment.id, "re:1", Some(json!({ "amount_minor": 300 })))
        .await;

    let dispute: Dispute = app.dispute(&payment.id, None).await.json().await.unwrap();

    assert_eq!(
        (dispute.amount_minor, dispute.reason),
        (500, DisputeReason::General)
    );
    let again = problem(app.dispute(&payment.id, None).await, 409).await;
    assert_eq!(
        again.problem_type,
        "urn:psp-sim:problem:payment-not-disputable"
    );
    let refund = problem(app.refund(&payment.id, "re:2", None).await, 409).await;
    assert_eq!(
        refund.problem_type,
        "urn:psp-sim:problem:refund-exceeds-remaining"
    );
}

#[tokio::test]
async fn only_captured_money_left_can_be_disputed() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_dispute_over", 100).await;
    let over = app
        .dispute(&payment.id, Some(json!({ "amount_minor": 101 })))
        .await;
    let refused = problem(over, 422).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:dispute-exceeds-remaining"
    );

    let held = app.pay_manual("ord_dispute_held", 100).await;
    let refused = problem(app.dispute(&held.id, None).await, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-disputable"
    );
    assert!(
        refused.detail.contains("requires_capture"),
        "{}",
        refused.detail
    );

    let unknown = problem(app.dispute("pay_unknown", None).await, 404).await;
    assert_eq!(
        unknown.problem_type,
        "urn:psp-sim:problem:payment-not-found"
    );
    let bad = app
        .dispute(&payment.id, Some(json!({ "reason": "bored" })))
        .await;
    let refused = problem(bad, 422).await;
    assert!(refused.detail.starts_with("reason: "), "{}", refused.detail);
    let zero = app
        .dispute(&payment.id, Some(json!({ "amount_minor": 0 })))
        .await;
    let refused = problem(zero, 422).await;
    assert!(
        refused.detail.starts_with("amount_minor"),
        "{}",
        refused.detail
    );
    assert!(app.payment(&payment.id).await.disputes.is_empty());
}
