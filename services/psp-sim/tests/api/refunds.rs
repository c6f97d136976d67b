//! Refunds: idempotent by key, never more than was paid.

use psp_sim::model::{Payment, Refund, RefundStatus};
use psp_sim::Faults;
use serde_json::json;

use crate::support::{payment_body, problem, TestApp};

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
async fn refunds_are_idempotent_by_key() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_refund", 1000).await;

    let first = app
        .refund(
            &payment.id,
            "refund:1",
            Some(json!({ "amount_minor": 400 })),
        )
        .await;
    assert_eq!(first.status(), 201);
    let first: Refund = first.json().await.unwrap();
    let again = app
        .refund(
            &payment.id,
            "refund:1",
            Some(json!({ "amount_minor": 400 })),
        )
        .await;
    assert_eq!(again.status(), 200);
    let again: Refund = again.json().await.unwrap();

    assert_eq!(again, first);
    assert!(first.id.starts_with("re_"));
    assert_eq!(first.payment_id, payment.id);
    assert_eq!(first.amount_minor, 400);
    assert_eq!(first.status, RefundStatus::Succeeded);
    let payment = app.payment_by_key(&payment.idempotency_key).await.unwrap();
    assert_eq!(payment.refunds, vec![first]);
    assert_eq!(app.metric("psp_sim_refunds_total").await, 1);
}

#[tokio::test]
async fn a_refund_without_an_amount_takes_the_rest_and_then_nothing_is_left() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_rest", 1000).await;
    app.refund(&payment.id, "r1", Some(json!({ "amount_minor": 300 })))
        .await;

    let rest: Refund = app
        .refund(&payment.id, "r2", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(rest.amount_minor, 700);

    let response = app
        .refund(&payment.id, "r3", Some(json!({ "amount_minor": 1 })))
        .await;
    let problem = problem(response, 409).await;
    assert_eq!(
        problem.problem_type,
        "urn:psp-sim:problem:refund-exceeds-remaining"
    );
}

#[tokio::test]
async fn refunding_more_than_was_paid_gets_409() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_too_much", 100).await;
    let response = app
        .refund(&payment.id, "r", Some(json!({ "amount_minor": 101 })))
        .await;
    problem(response, 409).await;
    assert!(app
        .payment_by_key(&payment.idempotency_key)
        .await
        .unwrap()
        .refunds
        .is_empty());
}

#[tokio::test]
async fn refunding_a_failed_payment_gets_409() {
    let app = TestApp::spawn_with(
        Faults {
            decline_rate: 1.0,
            ..Faults::default()
        },
        None,
    )
    .await;
    let payment = paid(&app, "ord_declined", 100).await;
    let response = app.refund(&payment.id, "r", None).await;
    let problem = problem(response, 409).await;
    assert_eq!(
        problem.problem_type,
        "urn:psp-sim:problem:payment-not-refundable"
    );
}

#[tokio::test]
async fn refunding_an_unknown_payment_gets_404() {
    let app = TestApp::spawn().await;
    problem(app.refund("pay_unknown", "r", None).await, 404).await;
}

#[tokio::test]
async fn a_refund_key_reused_with_another_amount_gets_422() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_refund_reuse", 1000).await;
    app.refund(&payment.id, "r", Some(json!({ "amount_minor": 10 })))
        .await;
    let response = app
        .refund(&payment.id, "r", Some(json!({ "amount_minor": 20 })))
        .await;
    problem(response, 422).await;
}

#[tokio::test]
async fn a_refund_without_an_idempotency_key_gets_400() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "ord_refund_no_key", 1000).await;
    let response = app
        .client
        .post(app.url(&format!("/v1/payments/{}/refunds", payment.id)))
        .send()
        .await
        .unwrap();
    problem(response, 400).await;
}
