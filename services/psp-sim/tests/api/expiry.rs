//! Authorizations lapse: with `authorization_ttl_ms`, a payment left `requires_capture` that
//! long is canceled as `expired`, also across a restart on the same data directory.

use psp_sim::model::{CancellationReason, Payment, PaymentStatus};
use psp_sim::webhook::EventType;
use psp_sim::Faults;

use crate::changes::ok;
use crate::support::{eventually, problem, settings_in, Receiver, Running, TestApp};

fn ttl(authorization_ttl_ms: u64) -> Faults {
    Faults {
        authorization_ttl_ms,
        ..Faults::default()
    }
}

async fn expired(app: &TestApp, payment_id: &str) -> Payment {
    eventually("the authorization to lapse", async || {
        let payment = app.payment(payment_id).await;
        (payment.status == PaymentStatus::Canceled).then_some(payment)
    })
    .await
}

#[tokio::test]
async fn an_authorization_not_captured_in_time_expires_and_says_so() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(ttl(200), Some(&receiver)).await;
    let captured_in_time = app.pay_manual("ord_in_time", 100).await;
    ok(app.capture(&captured_in_time.id, "cap:in_time", None).await).await;
    let held = app.pay_manual("ord_lapse", 100).await;

    let payment = expired(&app, &held.id).await;

    assert_eq!(
        payment.cancellation_reason,
        Some(CancellationReason::Expired)
    );
    assert_eq!(payment.amount_captured, 0);
    // The first one's timer fell due before the second's: the capture stood.
    let first = app.payment(&captured_in_time.id).await;
    assert_eq!(first.status, PaymentStatus::Succeeded);
    let deliveries = receiver.wait_for(4).await;
    let canceled: Vec<Payment> = deliveries
        .iter()
        .filter(|d| d.payload().event_type == EventType::PaymentCanceled)
        .map(|d| serde_json::from_value(d.payload().data).unwrap())
        .collect();
    assert_eq!(canceled, [payment]);
    let late = problem(app.capture(&held.id, "cap:late", None).await, 409).await;
    assert_eq!(
        late.problem_type,
        "urn:psp-sim:problem:payment-not-capturable"
    );
    assert!(late.detail.contains("is canceled"), "{}", late.detail);
    assert_eq!(
        app.metric("psp_sim_cancellations_total{reason=\"expired\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn an_authorization_timer_survives_a_restart_on_the_same_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let first = Running::start(settings_in(dir.path(), ttl(600_000))).await;
    let held = first.app.pay_manual("ord_lapse_restart", 100).await;
    assert_eq!(held.status, PaymentStatus::RequiresCapture);
    first.stop().await;

    // Authorized more than 50 ms ago by now: it lapses at once after this start.
    let second = Running::start(settings_in(dir.path(), ttl(50))).await;
    let payment = expired(&second.app, &held.id).await;
    assert_eq!(
        payment.cancellation_reason,
        Some(CancellationReason::Expired)
    );
    second.stop().await;

    // The expiry was journaled too.
    let third = Running::start(settings_in(dir.path(), ttl(0))).await;
    assert_eq!(third.app.payment(&held.id).await, payment);
    third.stop().await;
}
