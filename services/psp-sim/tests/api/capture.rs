//! Manual capture: a payment authorized and held (`requires_capture`) until the merchant
//! captures all or part of it; only captured money can be refunded.

use psp_sim::model::{CaptureMethod, Payment, PaymentStatus, Refund};
use psp_sim::webhook::EventType;
use psp_sim::Faults;
use serde_json::{json, Value};

use crate::changes::ok;
use crate::support::{payment_body, problem, settled, Receiver, TestApp};

#[tokio::test]
async fn a_manual_payment_is_held_uncaptured_and_announced_so() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;

    let held = app.pay_manual("ord_held", 1990).await;

    assert_eq!(held.status, PaymentStatus::RequiresCapture);
    assert_eq!(held.capture_method, CaptureMethod::Manual);
    assert_eq!((held.amount_minor, held.amount_captured), (1990, 0));
    assert_eq!(held.next_action, None);
    assert_eq!(app.payment(&held.id).await, held);
    let deliveries = receiver.wait_for(1).await;
    let payload = deliveries[0].payload();
    assert_eq!(payload.event_type, EventType::PaymentRequiresCapture);
    assert_eq!(
        serde_json::from_value::<Payment>(payload.data).unwrap(),
        held
    );
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"succeeded\"}")
            .await,
        0
    );
}

#[tokio::test]
async fn a_full_capture_takes_everything_and_succeeds() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let held = app.pay_manual("ord_full", 1000).await;

    let captured = ok(app.capture(&held.id, "cap:ord_full", None).await).await;

    assert_eq!(captured.status, PaymentStatus::Succeeded);
    assert_eq!(captured.amount_captured, 1000);
    assert_eq!(app.payment(&held.id).await, captured);
    let deliveries = receiver.wait_for(2).await;
    let succeeded: Vec<Payment> = deliveries
        .iter()
        .filter(|d| d.payload().event_type == EventType::PaymentSucceeded)
        .map(|d| serde_json::from_value(d.payload().data).unwrap())
        .collect();
    assert_eq!(succeeded, [captured]);
    assert_eq!(app.metric("psp_sim_captures_total{kind=\"full\"}").await, 1);
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"succeeded\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_partial_capture_releases_the_rest_and_limits_refunds_to_it() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_part", 1000).await;

    let captured = app
        .capture(&held.id, "cap:1", Some(json!({ "amount_minor": 600 })))
        .await;

    let captured = ok(captured).await;
    assert_eq!(captured.status, PaymentStatus::Succeeded);
    assert_eq!(
        (captured.amount_minor, captured.amount_captured),
        (1000, 600)
    );
    // The rest is released: nothing more can be captured, with any key.
    let again = app
        .capture(&held.id, "cap:2", Some(json!({ "amount_minor": 400 })))
        .await;
    let refused = problem(again, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-capturable"
    );
    assert!(refused.detail.contains("succeeded"), "{}", refused.detail);
    // Only the captured 600 can go back.
    let too_much = app
        .refund(&held.id, "re:1", Some(json!({ "amount_minor": 601 })))
        .await;
    let refused = problem(too_much, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:refund-exceeds-remaining"
    );
    let all: Refund = app
        .refund(&held.id, "re:2", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(all.amount_minor, 600);
    assert_eq!(app.payment(&held.id).await.amount_captured, 600);
    assert_eq!(
        app.metric("psp_sim_captures_total{kind=\"partial\"}").await,
        1
    );
}

#[tokio::test]
async fn a_capture_replayed_with_its_key_answers_the_same_payment_once() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(Faults::default(), Some(&receiver)).await;
    let held = app.pay_manual("ord_replay_cap", 800).await;
    let body = || Some(json!({ "amount_minor": 500 }));

    let first = ok(app.capture(&held.id, "cap:replay", body()).await).await;
    let again = ok(app.capture(&held.id, "cap:replay", body()).await).await;

    assert_eq!(again, first);
    let other = app
        .capture(&held.id, "cap:replay", Some(json!({ "amount_minor": 400 })))
        .await;
    let refused = problem(other, 422).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:idempotency-key-reused"
    );
    // One capture, counted two ways: by the PSP's counters and by its webhooks.
    assert_eq!(
        app.metric("psp_sim_captures_total{kind=\"partial\"}").await,
        1
    );
    assert_eq!(
        app.metric("psp_sim_idempotent_replays_total{resource=\"capture\"}")
            .await,
        1
    );
    app.pay("pay:marker", &payment_body(1, "ord_marker")).await;
    let deliveries = receiver.wait_for(3).await;
    let succeeded = deliveries
        .iter()
        .filter(|d| d.payload().data["reference"] == "ord_replay_cap")
        .filter(|d| d.payload().event_type == EventType::PaymentSucceeded)
        .count();
    assert_eq!(succeeded, 1);
}

#[tokio::test]
async fn capturing_more_than_authorized_or_nothing_is_refused() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_over", 100).await;

    let over = app
        .capture(&held.id, "cap:over", Some(json!({ "amount_minor": 101 })))
        .await;
    let refused = problem(over, 422).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:capture-exceeds-authorized"
    );
    for (key, body) in [
        ("cap:zero", json!({ "amount_minor": 0 })),
        ("cap:text", json!({ "amount_minor": "all" })),
        ("cap:tip", json!({ "tip": 5 })),
    ] {
        let refused = problem(app.capture(&held.id, key, Some(body.clone())).await, 422).await;
        assert_eq!(
            refused.problem_type, "urn:psp-sim:problem:invalid-body",
            "{body}"
        );
        let field = body.as_object().unwrap().keys().next().unwrap().clone();
        assert!(refused.detail.contains(&field), "{}", refused.detail);
    }
    // Nothing was captured: it can still be, in full.
    assert_eq!(app.payment(&held.id).await, held);
    let captured = ok(app.capture(&held.id, "cap:over", None).await).await;
    assert_eq!(captured.amount_captured, 100);
}

#[tokio::test]
async fn only_a_payment_awaiting_capture_can_be_captured() {
    let app = TestApp::spawn().await;
    let automatic: Payment = app
        .pay("pay:auto", &payment_body(100, "ord_auto"))
        .await
        .json()
        .await
        .unwrap();
    let refused = problem(app.capture(&automatic.id, "cap:auto", None).await, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-capturable"
    );
    assert!(
        refused.detail.contains("is succeeded"),
        "{}",
        refused.detail
    );

    let refused = problem(app.capture("pay_unknown", "cap:none", None).await, 404).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-found"
    );

    app.put_faults(&json!({ "processing_rate": 1.0, "processing_ms": 600_000 }))
        .await;
    let pending = app.pay_manual("ord_pending_cap", 100).await;
    assert_eq!(pending.status, PaymentStatus::Processing);
    let refused = problem(app.capture(&pending.id, "cap:pending", None).await, 409).await;
    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-processing"
    );
}

#[tokio::test]
async fn uncaptured_money_cannot_be_refunded() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_uncaptured", 500).await;

    let refused = problem(app.refund(&held.id, "re:early", None).await, 409).await;

    assert_eq!(
        refused.problem_type,
        "urn:psp-sim:problem:payment-not-captured"
    );
    assert!(
        refused.detail.contains("requires_capture"),
        "{}",
        refused.detail
    );
    assert!(app.payment(&held.id).await.refunds.is_empty());
    assert_eq!(app.metric("psp_sim_refunds_total").await, 0);
}

#[tokio::test]
async fn a_manual_processing_payment_settles_to_requires_capture() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        processing_rate: 1.0,
        processing_ms: 50,
        ..Faults::default()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    let created = app.pay_manual("ord_slow_manual", 300).await;
    assert_eq!(created.status, PaymentStatus::Processing);

    let payment = settled(&app, "pay:ord_slow_manual").await;

    assert_eq!(payment.status, PaymentStatus::RequiresCapture);
    assert_eq!(payment.amount_captured, 0);
    let deliveries = receiver.wait_for(1).await;
    assert_eq!(
        deliveries[0].payload().event_type,
        EventType::PaymentRequiresCapture
    );
    let body: Value = app
        .capture(&payment.id, "cap:slow", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["amount_captured"], 300);
}

#[tokio::test]
async fn fail_first_answers_a_capture_503_and_captures_nothing() {
    let app = TestApp::spawn().await;
    let held = app.pay_manual("ord_fail_cap", 100).await;
    app.put_faults(&json!({ "fail_first": 1 })).await;

    let refused = problem(app.capture(&held.id, "cap:retry", None).await, 503).await;

    assert_eq!(refused.problem_type, "urn:psp-sim:problem:injected-failure");
    assert_eq!(app.payment(&held.id).await, held);
    let captured = ok(app.capture(&held.id, "cap:retry", None).await).await;
    assert_eq!(captured.amount_captured, 100);
}
