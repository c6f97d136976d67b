//! An operator refunds part of a confirmed order's payment, through the
//! admin API or `soldonce order refund`: once per key, never beyond what
//! the payment took, counted at psp-sim and in soldonce's own rows.

use soldonce_tests::app::Reply;
use soldonce_tests::app::ADMIN_TOKEN;
use soldonce_tests::eventually;
use soldonce_tests::relay::binary;
use soldonce_tests::saga::{assert_audit_clean, Saga, SagaOptions};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

async fn ask(saga: &Saga, order: &str, token: Option<&str>, body: serde_json::Value) -> Reply {
    let mut request = saga
        .app
        .client
        .post(saga.app.url(&format!("/admin/v1/orders/{order}/refunds")))
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    saga.app.send(request).await
}

/// `soldonce order refund ORDER ARGS…`: its exit code and stderr.
fn cli_refund(saga: &Saga, order: &str, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(binary("soldonce"))
        .args(["order", "refund", order])
        .args(args)
        .env("DATABASE_URL", &saga.app.database_url)
        .output()
        .expect("run soldonce order refund");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The amounts psp-sim refunded of the order's one payment, once `n` are made.
async fn psp_refunds(saga: &Saga, order: &str, n: usize) -> Vec<i64> {
    eventually(&format!("{n} refunds at the PSP"), SETTLE, || async {
        let payments = saga.psp_payments(order).await;
        let [p] = &payments[..] else { return None };
        let amounts: Vec<i64> = p["refunds"]
            .as_array()?
            .iter()
            .filter(|r| r["status"] == "succeeded")
            .filter_map(|r| r["amount_minor"].as_i64())
            .collect();
        (amounts.len() == n).then_some(amounts)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_refund_asked_twice_with_one_key_is_made_once_and_never_beyond_what_was_taken() {
    let saga = Saga::start_with(SagaOptions {
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");

    let first = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "ticket-1", "amount_minor": 1000}),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "ticket-1", "amount_minor": 1000}),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    let (code, err) = cli_refund(&saga, &id, &["--amount-minor", "1000", "--key", "ticket-1"]);
    assert_eq!(
        code, 0,
        "the CLI's ask with the same key is the same refund: {err}"
    );
    assert_eq!(
        psp_refunds(&saga, &id, 1).await,
        [1000],
        "one refund at the PSP"
    );
    saga.app
        .wait_count(
            "the refund recorded",
            "SELECT count(*) FROM operator_refunds WHERE state = 'succeeded' AND amount_minor = 1000",
            1,
        )
        .await;

    // More than is left (1,500), through either door: refused, nothing changed.
    let over = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "ticket-2", "amount_minor": 1600}),
    )
    .await;
    assert_eq!(over.status, 422, "{}", over.body);
    assert_eq!(over.body["field"], "amount_minor", "{}", over.body);
    let (code, err) = cli_refund(&saga, &id, &["--amount-minor", "1600", "--key", "ticket-3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("1500 left"), "one clear line: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A key reused for another amount, a bad token, no token: refused too.
    let reused = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "ticket-1", "amount_minor": 5}),
    )
    .await;
    assert_eq!(
        (reused.status, reused.body["field"].as_str()),
        (422, Some("key")),
        "{}",
        reused.body
    );
    let forged = ask(
        &saga,
        &id,
        Some("not-the-admin-token-at-all"),
        serde_json::json!({"key": "x", "amount_minor": 1}),
    )
    .await;
    assert_eq!(forged.status, 401, "{}", forged.body);
    let buyer = ask(
        &saga,
        &id,
        Some(&saga.app.token),
        serde_json::json!({"key": "x", "amount_minor": 1}),
    )
    .await;
    assert_eq!(
        buyer.status, 401,
        "a buyer's token is not an operator's: {}",
        buyer.body
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM operator_refunds")
            .await,
        1,
        "nothing refused was recorded"
    );

    // The rest, by line through the CLI: 1 MUG at 2,500 is more than the 1,500 left.
    let (code, err) = cli_refund(&saga, &id, &["--line", "MUG:1", "--key", "ticket-4"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = cli_refund(
        &saga,
        &id,
        &["--amount-minor", "1500", "--key", "ticket-4", "--by", "ana"],
    );
    assert_eq!(code, 0, "{err}");
    let mut made = psp_refunds(&saga, &id, 2).await;
    made.sort_unstable();
    assert_eq!(made, [1000, 1500], "the whole payment back, in two refunds");
    saga.app
        .wait_count(
            "both refunds recorded on the order",
            "SELECT count(*) FROM events WHERE type = 'order.operator_refunded.v1'",
            2,
        )
        .await;
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.operator_refund_decided.v1'")
            .await,
        2
    );
    let order = saga
        .app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await;
    assert_eq!(
        order.body["state"], "confirmed",
        "the order keeps its state"
    );
    assert_audit_clean(&saga.app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_is_refunded_only_once_captured() {
    let mut saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
    let early = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "k", "amount_minor": 500}),
    )
    .await;
    assert_eq!(early.status, 409, "nothing taken yet: {}", early.body);
    saga.start_fulfillment(Duration::from_millis(50)).await;
    saga.wait_quiescent(SETTLE).await;
    let later = ask(
        &saga,
        &id,
        Some(ADMIN_TOKEN),
        serde_json::json!({"key": "k", "amount_minor": 500}),
    )
    .await;
    assert_eq!(later.status, 201, "{}", later.body);
    assert_eq!(psp_refunds(&saga, &id, 1).await, [500]);
    let payment = &saga.psp_payments(&id).await[0];
    assert_eq!(payment["amount_captured"], 2500, "{payment}");
}
