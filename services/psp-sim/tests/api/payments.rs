//! Idempotent payments and lookups.

use psp_sim::model::{Payment, PaymentStatus};
use serde_json::{json, Value};

use crate::support::{payment_body, problem, TestApp};

#[tokio::test]
async fn the_same_key_returns_the_same_payment() {
    let app = TestApp::spawn().await;
    let body = payment_body(1990, "ord_same_key");

    let first = app.pay("pay:ord_same_key", &body).await;
    assert_eq!(first.status(), 201);
    let first: Payment = first.json().await.unwrap();
    let again = app.pay("pay:ord_same_key", &body).await;
    assert_eq!(again.status(), 200);
    let again: Payment = again.json().await.unwrap();

    assert_eq!(again, first);
    assert_eq!(first.status, PaymentStatus::Succeeded);
    assert_eq!(first.idempotency_key, "pay:ord_same_key");
    // One charge, counted two ways: by reference and by the PSP's own counters.
    assert_eq!(app.payments_for("ord_same_key").await, vec![first]);
    assert_eq!(
        app.metric("psp_sim_payments_total{status=\"succeeded\"}")
            .await,
        1
    );
    assert_eq!(
        app.metric("psp_sim_idempotent_replays_total{resource=\"payment\"}")
            .await,
        1
    );
}

#[tokio::test]
async fn a_payment_has_the_documented_shape() {
    let app = TestApp::spawn().await;
    let payment: Value = app
        .pay("k-shape", &payment_body(500, "ord_shape"))
        .await
        .json()
        .await
        .unwrap();
    let id = payment["id"].as_str().unwrap();
    assert!(id.starts_with("pay_") && id.len() == 36, "{id}");
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount_minor"], 500);
    assert_eq!(payment["currency"], "BRL");
    assert_eq!(payment["reference"], "ord_shape");
    assert_eq!(payment["idempotency_key"], "k-shape");
    assert_eq!(payment["failure_reason"], Value::Null);
    assert!(chrono::DateTime::parse_from_rfc3339(payment["created_at"].as_str().unwrap()).is_ok());
    assert_eq!(payment["refunds"], json!([]));
}

#[tokio::test]
async fn a_reused_key_with_a_different_body_gets_422() {
    let app = TestApp::spawn().await;
    app.pay("k-reused", &payment_body(100, "ord_reused")).await;

    let response = app.pay("k-reused", &payment_body(101, "ord_reused")).await;

    let problem = problem(response, 422).await;
    assert_eq!(
        problem.problem_type,
        "urn:psp-sim:problem:idempotency-key-reused"
    );
    assert_eq!(app.payments_for("ord_reused").await.len(), 1);
}

#[tokio::test]
async fn a_payment_without_an_idempotency_key_gets_400() {
    let app = TestApp::spawn().await;
    let response = app
        .client
        .post(app.url("/v1/payments"))
        .json(&payment_body(100, "ord_no_key"))
        .send()
        .await
        .unwrap();

    let problem = problem(response, 400).await;
    assert!(
        problem.detail.contains("Idempotency-Key"),
        "{}",
        problem.detail
    );
    assert!(app.payments_for("ord_no_key").await.is_empty());
}

#[tokio::test]
async fn unknown_fields_and_broken_rules_get_422_and_bad_json_gets_400() {
    let app = TestApp::spawn().await;
    let mut extra = payment_body(100, "ord_bad");
    extra["tip"] = json!(5);
    let detail = problem(app.pay("k1", &extra).await, 422).await.detail;
    assert!(detail.contains("tip"), "{detail}");

    let detail = problem(app.pay("k2", &payment_body(0, "ord_bad")).await, 422)
        .await
        .detail;
    assert!(detail.starts_with("amount_minor"), "{detail}");

    let lower = json!({ "amount_minor": 1, "currency": "brl", "reference": "ord_bad" });
    let detail = problem(app.pay("k3", &lower).await, 422).await.detail;
    assert!(detail.starts_with("currency"), "{detail}");

    let response = app
        .client
        .post(app.url("/v1/payments"))
        .header("Idempotency-Key", "k4")
        .body("{not json")
        .send()
        .await
        .unwrap();
    problem(response, 400).await;
    assert!(app.payments_for("ord_bad").await.is_empty());
}

#[tokio::test]
async fn a_payment_can_be_read_by_id_and_by_key() {
    let app = TestApp::spawn().await;
    let payment: Payment = app
        .pay("k-read", &payment_body(700, "ord_read"))
        .await
        .json()
        .await
        .unwrap();

    let by_id: Payment = app
        .client
        .get(app.url(&format!("/v1/payments/{}", payment.id)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_id, payment);
    assert_eq!(app.payment_by_key("k-read").await, Some(payment));
    assert_eq!(app.payment_by_key("k-never-used").await, None);
}

#[tokio::test]
async fn unknown_payments_and_routes_get_404_problems() {
    let app = TestApp::spawn().await;
    let response = app
        .client
        .get(app.url("/v1/payments/pay_nope"))
        .send()
        .await
        .unwrap();
    problem(response, 404).await;
    let response = app.client.get(app.url("/v2/nothing")).send().await.unwrap();
    problem(response, 404).await;
}

#[tokio::test]
async fn a_lookup_takes_one_of_key_or_reference_and_no_listing_parameters() {
    let app = TestApp::spawn().await;
    for query in [
        "idempotency_key=a&reference=b",
        "reference=b&limit=10",
        "idempotency_key=a&created_gte=2026-01-01T00:00:00Z",
        "reference=b&cursor=x",
    ] {
        let response = app
            .client
            .get(app.url(&format!("/v1/payments?{query}")))
            .send()
            .await
            .unwrap();
        let problem = problem(response, 400).await;
        assert_eq!(problem.problem_type, "urn:psp-sim:problem:invalid-query");
    }
    assert!(app.payments_for("ord_nothing_here").await.is_empty());
}

#[tokio::test]
async fn health_and_metrics_answer() {
    let app = TestApp::spawn().await;
    let health: Value = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health, json!({ "status": "ok" }));
    assert_eq!(app.metric("psp_sim_refunds_total").await, 0);
    assert_eq!(
        app.metric("psp_sim_faults_injected_total{fault=\"fail_first\"}")
            .await,
        0
    );
}
