//! 3-D Secure: with `action_required_rate`, a new payment waits for the buyer
//! (`requires_action`, `next_action.url`), who succeeds, fails or abandons through `/action`.

use psp_sim::model::{CancellationReason, FailureReason, NextActionType, Payment, PaymentStatus};
use psp_sim::webhook::EventType;
use psp_sim::{Faults, Settings};
use serde_json::json;

use crate::changes::ok;
use crate::support::{payment_body, problem, Receiver, Running, TestApp};

fn always_action() -> Faults {
    Faults {
        action_required_rate: 1.0,
        ..Faults::default()
    }
}

async fn awaiting(app: &TestApp, reference: &str) -> Payment {
    let response = app
        .pay(&format!("pay:{reference}"), &payment_body(900, reference))
        .await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

#[tokio::test]
async fn a_payment_awaiting_the_buyer_says_where_to_send_them() {
    let receiver = Receiver::start(0).await;
    // The decline and processing rolls do not apply to it.
    let faults = Faults {
        decline_rate: 1.0,
        processing_rate: 1.0,
        ..always_action()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;

    let payment = awaiting(&app, "ord_3ds").await;

    assert_eq!(payment.status, PaymentStatus::RequiresAction);
    assert_eq!((payment.failure_reason, payment.amount_captured), (None, 0));
    let action = payment.next_action.clone().expect("a next_action");
    assert_eq!(action.action_type, NextActionType::RedirectToUrl);
    assert_eq!(
        action.url,
        format!("http://{}/v1/payments/{}/action", app.addr, payment.id)
    );
    assert_eq!(app.payment(&payment.id).await, payment);
    assert_eq!(
        app.payments_for("ord_3ds").await,
        std::slice::from_ref(&payment)
    );
    let deliveries = receiver.wait_for(1).await;
    let payload = deliveries[0].payload();
    assert_eq!(payload.event_type, EventType::PaymentRequiresAction);
    assert_eq!(payload.data["next_action"]["url"], action.url.as_str());
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"action_required\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_successful_action_authorizes_and_captures_an_automatic_payment() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(always_action(), Some(&receiver)).await;
    let payment = awaiting(&app, "ord_3ds_ok").await;

    let done = ok(app.act(&payment.id, "succeeded").await).await;

    assert_eq!(done.status, PaymentStatus::Succeeded);
    assert_eq!((done.amount_captured, &done.next_action), (900, &None));
    assert_eq!(app.payment(&payment.id).await, done);
    let deliveries = receiver.wait_for(2).await;
    let kinds: Vec<EventType> = deliveries.iter().map(|d| d.payload().event_type).collect();
    assert!(kinds.contains(&EventType::PaymentSucceeded), "{kinds:?}");
}

#[tokio::test]
async fn a_successful_action_holds_a_manual_payment_for_capture() {
    let app = TestApp::spawn_with(always_action(), None).await;
    let payment = app.pay_manual("ord_3ds_manual", 400).await;
    assert_eq!(payment.status, PaymentStatus::RequiresAction);

    let done = ok(app.act(&payment.id, "succeeded").await).await;

    assert_eq!(done.status, PaymentStatus::RequiresCapture);
    assert_eq!(done.amount_captured, 0);
    let captured = ok(app.capture(&payment.id, "cap:3ds", None).await).await;
    assert_eq!(captured.amount_captured, 400);
}

#[tokio::test]
async fn a_failed_action_fails_the_payment_for_authentication() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(always_action(), Some(&receiver)).await;
    let payment = awaiting(&app, "ord_3ds_no").await;

    let done = ok(app.act(&payment.id, "failed").await).await;

    assert_eq!(done.status, PaymentStatus::Failed);
    assert_eq!(
        done.failure_reason,
        Some(FailureReason::AuthenticationFailed)
    );
    assert_eq!(app.payment(&payment.id).await, done);
    let deliveries = receiver.wait_for(2).await;
    let failed = deliveries
        .iter()
        .find(|d| d.payload().event_type == EventType::PaymentFailed)
        .expect("a payment.failed webhook");
    assert_eq!(
        failed.payload().data["failure_reason"],
        "authentication_failed"
    );
    // Not a decline: the decline fault counts nothing.
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"decline\"}")
            .await,
        0
    );
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"failed\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn an_abandoned_action_cancels_the_payment() {
    let app = TestApp::spawn_with(always_action(), None).await;
    let payment = awaiting(&app, "ord_3ds_gone").await;

    let done = ok(app.act(&payment.id, "abandoned").await).await;

    assert_eq!(done.status, PaymentStatus::Canceled);
    assert_eq!(
        done.cancellation_reason,
        Some(CancellationReason::Abandoned)
    );
    assert_eq!(app.payment(&payment.id).await, done);
    assert_eq!(
        app.metric("psp_sim_cancellations_total{reason=\"abandoned\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn acting_on_a_payment_not_awaiting_the_buyer_gets_409() {
    let app = TestApp::spawn_with(always_action(), None).await;
    let payment = awaiting(&app, "ord_3ds_twice").await;
    ok(app.act(&payment.id, "succeeded").await).await;

    let again = problem(app.act(&payment.id, "failed").await, 409).await;

    assert_eq!(
        again.problem_type,
        "urn:psp-sim:problem:payment-not-awaiting-action"
    );
    assert!(again.detail.contains("is succeeded"), "{}", again.detail);
    assert_eq!(
        app.payment(&payment.id).await.status,
        PaymentStatus::Succeeded
    );
    let unknown = problem(app.act("pay_unknown", "succeeded").await, 404).await;
    assert_eq!(
        unknown.problem_type,
        "urn:psp-sim:problem:payment-not-found"
    );
}

#[tokio::test]
async fn a_bad_action_body_names_the_field_and_changes_nothing() {
    let app = TestApp::spawn_with(always_action(), None).await;
    let payment = awaiting(&app, "ord_3ds_bad").await;
    let url = app.url(&format!("/v1/payments/{}/action", payment.id));

    let maybe = app
        .client
        .post(&url)
        .json(&json!({ "outcome": "maybe" }))
        .send()
        .await
        .unwrap();
    let refused = problem(maybe, 422).await;
    assert!(
        refused.detail.starts_with("outcome: "),
        "{}",
        refused.detail
    );
    let empty = app.client.post(&url).json(&json!({})).send().await.unwrap();
    let refused = problem(empty, 422).await;
    assert!(refused.detail.contains("outcome"), "{}", refused.detail);

    assert_eq!(app.payment(&payment.id).await, payment);
}

#[tokio::test]
async fn a_waiting_payment_can_be_canceled_by_the_merchant() {
    let app = TestApp::spawn_with(always_action(), None).await;
    let payment = awaiting(&app, "ord_3ds_void").await;

    let canceled = ok(app.cancel(&payment.id, "void:3ds").await).await;

    assert_eq!(
        canceled.cancellation_reason,
        Some(CancellationReason::Requested)
    );
    assert_eq!(canceled.next_action, None);
    let late = problem(app.act(&payment.id, "succeeded").await, 409).await;
    assert_eq!(
        late.problem_type,
        "urn:psp-sim:problem:payment-not-awaiting-action"
    );
}

#[tokio::test]
async fn psp_sim_public_url_sets_where_next_action_points() {
    let settings = Settings {
        addr: "127.0.0.1:0".parse().unwrap(),
        faults: always_action(),
        public_url: Some("https://psp.example/base/".parse().unwrap()),
        ..Settings::default()
    };
    let running = Running::start(settings).await;

    let payment = awaiting(&running.app, "ord_public").await;

    let url = payment.next_action.expect("a next_action").url;
    assert_eq!(
        url,
        format!("https://psp.example/base/v1/payments/{}/action", payment.id)
    );
    running.stop().await;
}
