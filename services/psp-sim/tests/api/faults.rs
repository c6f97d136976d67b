//! Fault knobs: injected 503s, declines, latency, lost replies, and the admin endpoint.

use std::time::{Duration, Instant};

use psp_sim::model::{FailureReason, Payment, PaymentStatus};
use psp_sim::{Faults, Settings};
use serde_json::{json, Value};

use crate::support::{eventually, payment_body, problem, Receiver, TestApp};

#[tokio::test]
async fn fail_first_two_answers_503_twice_then_charges_once() {
    let app = TestApp::spawn_with(
        Faults {
            fail_first: 2,
            ..Faults::default()
        },
        None,
    )
    .await;
    let body = payment_body(1500, "ord_fail_first");

    problem(app.pay("pay:ord_fail_first", &body).await, 503).await;
    assert!(app.payments_for("ord_fail_first").await.is_empty());
    problem(app.pay("pay:ord_fail_first", &body).await, 503).await;
    let response = app.pay("pay:ord_fail_first", &body).await;

    assert_eq!(response.status(), 201);
    assert_eq!(app.payments_for("ord_fail_first").await.len(), 1);
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"fail_first\"}")
            .await,
        2
    );
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"succeeded\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_decline_rate_of_one_fails_the_payment() {
    let app = TestApp::spawn_with(
        Faults {
            decline_rate: 1.0,
            ..Faults::default()
        },
        None,
    )
    .await;

    let response = app
        .pay("pay:ord_declined", &payment_body(100, "ord_declined"))
        .await;

    assert_eq!(response.status(), 201);
    let payment: Payment = response.json().await.unwrap();
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_reason, Some(FailureReason::CardDeclined));
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"failed\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn latency_delays_every_api_call() {
    let app = TestApp::spawn_with(
        Faults {
            latency_ms: 300,
            ..Faults::default()
        },
        None,
    )
    .await;
    let started = Instant::now();
    app.pay("k-slow", &payment_body(1, "ord_slow")).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_lost_reply_times_out_but_the_payment_and_its_webhook_exist() {
    let receiver = Receiver::start(0).await;
    let faults = Faults {
        lose_reply_rate: 1.0,
        ..Faults::default()
    };
    let app = TestApp::spawn_with(faults, Some(&receiver)).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();

    let outcome = impatient
        .post(app.url("/v1/payments"))
        .header("Idempotency-Key", "pay:ord_lost")
        .json(&payment_body(990, "ord_lost"))
        .send()
        .await;

    let error = outcome.expect_err("a lost reply must not arrive");
    assert!(error.is_timeout(), "{error:?}");
    let payment = app
        .payment_by_key("pay:ord_lost")
        .await
        .expect("the charge happened");
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    let deliveries = receiver.wait_for(1).await;
    assert_eq!(deliveries[0].payload().data["id"], payment.id.as_str());
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"lose_reply\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_held_reply_is_cut_not_answered_when_the_app_stops() {
    let settings = Settings {
        addr: "127.0.0.1:0".parse().unwrap(),
        faults: Faults {
            lose_reply_rate: 1.0,
            ..Faults::default()
        },
        ..Settings::default()
    };
    let (addr, app) = TestApp::build(settings).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let app = TestApp {
        addr,
        client: reqwest::Client::new(),
    };
    let request = tokio::spawn({
        let request = app
            .client
            .post(app.url("/v1/payments"))
            .header("Idempotency-Key", "pay:ord_cut")
            .json(&payment_body(10, "ord_cut"));
        async move { request.send().await }
    });
    eventually("the payment to be recorded", async || {
        app.payment_by_key("pay:ord_cut").await
    })
    .await;

    stop.send(()).unwrap();

    // hyper aborts the connection before the status line: the client sees no response at all.
    let error = request
        .await
        .unwrap()
        .expect_err("a held reply must be cut, not answered");
    assert!(error.is_request() && error.status().is_none(), "{error:?}");
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn faults_round_trip_through_the_admin_endpoint() {
    let app = TestApp::spawn().await;
    let wanted = json!({
        "decline_rate": 0.25,
        "latency_ms": 5,
        "fail_first": 1,
        "lose_reply_rate": 0.0,
        "webhook_delay_ms": 10,
        "webhook_duplicates": 2,
        "webhook_reorder": true,
        "drop_webhook_rate": 0.5,
        "processing_rate": 0.75,
        "processing_ms": 250,
        "action_required_rate": 0.5,
        "authorization_ttl_ms": 604_800_000
    });

    let response = app.put_faults(&wanted).await;
    assert_eq!(response.status(), 200);
    let read: Value = app
        .client
        .get(app.url("/admin/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read, wanted);

    // A replacement is total: what is left out goes back to its default.
    app.put_faults(&json!({ "decline_rate": 1.0 })).await;
    let read: Faults = app
        .client
        .get(app.url("/admin/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        read,
        Faults {
            decline_rate: 1.0,
            ..Faults::default()
        }
    );
    let payment: Payment = app
        .pay("k-admin", &payment_body(1, "ord_admin"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(payment.status, PaymentStatus::Failed);
}

#[tokio::test]
async fn an_unknown_fault_field_gets_422() {
    let app = TestApp::spawn().await;
    let response = app
        .put_faults(&json!({ "decline_rate": 0.1, "meteor_strike": true }))
        .await;
    let problem = problem(response, 422).await;
    assert_eq!(problem.detail, "meteor_strike: unknown field");
    let read: Faults = app
        .client
        .get(app.url("/admin/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read, Faults::default());
}

#[tokio::test]
async fn an_out_of_range_fault_gets_422_naming_the_field() {
    let app = TestApp::spawn().await;
    let problem = problem(app.put_faults(&json!({ "lose_reply_rate": 2 })).await, 422).await;
    assert!(
        problem.detail.starts_with("lose_reply_rate: "),
        "{}",
        problem.detail
    );
    let problem = problem_of(&app, json!({ "webhook_duplicates": "three" })).await;
    assert!(problem.starts_with("webhook_duplicates: "), "{problem}");
}

async fn problem_of(app: &TestApp, faults: Value) -> String {
    problem(app.put_faults(&faults).await, 422).await.detail
}
