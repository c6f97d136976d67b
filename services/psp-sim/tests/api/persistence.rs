//! Books that survive a restart: with `PSP_SIM_DATA_DIR`, every change is journaled before it
//! is answered and replayed at start, in-process and across a SIGKILL of the real binary
//! (authorization timers: see `expiry`).

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;

use psp_sim::model::{FailureReason, Payment, PaymentStatus, Refund};
use psp_sim::{Application, Faults};
use serde_json::json;

use crate::support::{eventually, payment_body, settings_in, settled, Listing, Running, TestApp};

/// Long enough that nothing settles while a test looks.
const NEVER_MS: u64 = 600_000;

fn settling_after(processing_ms: u64) -> Faults {
    Faults {
        processing_ms,
        ..Faults::default()
    }
}

async fn created<T: serde::de::DeserializeOwned>(response: reqwest::Response) -> T {
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

/// Every payment and every refund, each listing read to its end, two at a time.
async fn books(app: &TestApp) -> (Vec<Payment>, Vec<Refund>) {
    (
        every(app.list_all("/v1/payments", 2).await),
        every(app.list_all("/v1/refunds", 2).await),
    )
}

fn every<T>(pages: Vec<Listing<T>>) -> Vec<T> {
    pages.into_iter().flat_map(|page| page.data).collect()
}

#[tokio::test]
async fn the_books_survive_a_restart_on_the_same_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let first = Running::start(settings_in(dir.path(), Faults::default())).await;
    let app = &first.app;
    let paid: Payment = created(app.pay("pay:1", &payment_body(1000, "ord_1")).await).await;
    let refund: Refund = created(
        app.refund(&paid.id, "refund:1", Some(json!({ "amount_minor": 300 })))
            .await,
    )
    .await;
    app.put_faults(&json!({ "decline_rate": 1.0 })).await;
    created::<Payment>(app.pay("pay:2", &payment_body(500, "ord_2")).await).await;
    // Declined, but nobody can know until it settles, after the restart.
    let slow = json!({ "decline_rate": 1.0, "processing_rate": 1.0, "processing_ms": NEVER_MS });
    app.put_faults(&slow).await;
    let pending: Payment = created(app.pay("pay:3", &payment_body(700, "ord_3")).await).await;
    assert_eq!(pending.status, PaymentStatus::Processing);
    let before = books(app).await;
    first.stop().await;

    let second = Running::start(settings_in(dir.path(), settling_after(NEVER_MS))).await;
    let app = &second.app;
    assert_eq!(books(app).await, before);
    assert_eq!(before.0.len(), 3);
    assert_eq!(before.1, std::slice::from_ref(&refund));
    // The same keys replay the same payment and refund; nothing new happens.
    let again = app.pay("pay:1", &payment_body(1000, "ord_1")).await;
    assert_eq!(again.status(), 200);
    let replayed: Payment = again.json().await.unwrap();
    assert_eq!(replayed.refunds, std::slice::from_ref(&refund));
    let again = app
        .refund(&paid.id, "refund:1", Some(json!({ "amount_minor": 300 })))
        .await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Refund>().await.unwrap(), refund);
    assert_eq!(books(app).await, before);
    second.stop().await;

    // Still processing at this start: it settles processing_ms later, as rolled before.
    let third = Running::start(settings_in(dir.path(), settling_after(50))).await;
    let payment = settled(&third.app, "pay:3").await;
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_reason, Some(FailureReason::CardDeclined));
    third.stop().await;

    // The settlement was journaled too.
    let fourth = Running::start(settings_in(dir.path(), settling_after(NEVER_MS))).await;
    let payment = fourth.app.payment_by_key("pay:3").await.unwrap();
    assert_eq!(payment.status, PaymentStatus::Failed);
    fourth.stop().await;
}

#[tokio::test]
async fn a_last_line_cut_short_by_a_crash_is_dropped_and_the_rest_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let first = Running::start(settings_in(dir.path(), Faults::default())).await;
    let kept: Payment = created(first.app.pay("k1", &payment_body(10, "o1")).await).await;
    first.stop().await;
    let mut journal = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("ledger.jsonl"))
        .unwrap();
    journal
        .write_all(br#"{"entry":"payment_created","paym"#)
        .unwrap();

    let second = Running::start(settings_in(dir.path(), Faults::default())).await;
    assert_eq!(second.app.payment_by_key("k1").await, Some(kept.clone()));
    let later: Payment = created(second.app.pay("k2", &payment_body(20, "o2")).await).await;
    second.stop().await;

    // The new entry went on a line of its own, so a third start reads both.
    let third = Running::start(settings_in(dir.path(), Faults::default())).await;
    assert_eq!(books(&third.app).await.0, [kept, later]);
    third.stop().await;
}

#[tokio::test]
async fn a_corrupt_line_stops_the_start_naming_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let first = Running::start(settings_in(dir.path(), Faults::default())).await;
    created::<Payment>(first.app.pay("k1", &payment_body(10, "o1")).await).await;
    created::<Payment>(first.app.pay("k2", &payment_body(10, "o2")).await).await;
    first.stop().await;
    let path = dir.path().join("ledger.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{{\"entry\":\"mystery\"}}\n{text}")).unwrap();

    let Err(error) = Application::build(settings_in(dir.path(), Faults::default())).await else {
        panic!("a corrupt journal must stop the start");
    };

    let message = error.to_string();
    assert!(message.contains("ledger.jsonl:1: "), "{message}");
    assert_eq!(message.lines().count(), 1);
}

/// The real binary, on a port of its own, keeping its books in `dir`.
async fn start_binary(dir: &Path, faults: &str) -> (tokio::process::Child, TestApp) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let logs = || match std::env::var_os("TEST_LOG") {
        Some(_) => Stdio::inherit(),
        None => Stdio::null(),
    };
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_psp-sim"))
        .env_clear()
        .env("PSP_SIM_ADDR", format!("127.0.0.1:{port}"))
        .env("PSP_SIM_DATA_DIR", dir)
        .env("PSP_FAULTS", faults)
        .stdout(logs())
        .stderr(logs())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let app = TestApp {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        client: reqwest::Client::new(),
    };
    eventually("the psp-sim binary to answer", async || {
        let response = app.client.get(app.url("/healthz")).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;
    (child, app)
}

#[tokio::test]
async fn the_books_survive_a_sigkill_of_the_real_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, app) = start_binary(dir.path(), "{}").await;
    let mut payments = Vec::new();
    let mut refunds = Vec::new();
    for i in 0..5 {
        let body = payment_body(1000, &format!("ord_kill_{i}"));
        let payment: Payment = created(app.pay(&format!("pay:kill:{i}"), &body).await).await;
        if i % 2 == 0 {
            let part = Some(json!({ "amount_minor": 250 }));
            let refund: Refund =
                created(app.refund(&payment.id, &format!("re:{i}"), part).await).await;
            refunds.push(refund.id);
        }
        payments.push(payment.id);
    }
    let slow = json!({ "processing_rate": 1.0, "processing_ms": NEVER_MS });
    app.put_faults(&slow).await;
    let body = payment_body(990, "ord_kill_pending");
    let pending: Payment = created(app.pay("pay:kill:pending", &body).await).await;
    payments.push(pending.id.clone());

    child.kill().await.unwrap();
    let (mut child, app) = start_binary(dir.path(), r#"{"processing_ms": 50}"#).await;

    let (listed_payments, listed_refunds) = books(&app).await;
    let listed: Vec<String> = listed_payments.into_iter().map(|p| p.id).collect();
    assert_eq!(listed, payments);
    let listed: Vec<String> = listed_refunds.into_iter().map(|r| r.id).collect();
    assert_eq!(listed, refunds);
    assert_eq!(
        settled(&app, "pay:kill:pending").await.status,
        PaymentStatus::Succeeded
    );
    let again = app.pay("pay:kill:pending", &body).await;
    assert_eq!(again.status(), 200);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn captures_cancels_actions_and_disputes_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = Running::start(settings_in(dir.path(), Faults::default())).await;
    let app = &first.app;
    let part = || Some(json!({ "amount_minor": 400 }));
    let captured = app.pay_manual("ord_cap", 1000).await;
    assert_eq!(
        app.capture(&captured.id, "cap:1", part()).await.status(),
        200
    );
    let voided = app.pay_manual("ord_void", 500).await;
    assert_eq!(app.cancel(&voided.id, "void:1").await.status(), 200);
    let disputed: Payment = created(app.pay("pay:d", &payment_body(300, "ord_d")).await).await;
    assert_eq!(app.dispute(&disputed.id, None).await.status(), 201);
    app.put_faults(&json!({ "action_required_rate": 1.0 }))
        .await;
    let failed: Payment = created(app.pay("pay:3ds", &payment_body(200, "ord_3ds")).await).await;
    assert_eq!(app.act(&failed.id, "failed").await.status(), 200);
    let waiting: Payment = created(app.pay("pay:wait", &payment_body(200, "ord_w")).await).await;
    let before = books(app).await;
    first.stop().await;

    let second = Running::start(settings_in(dir.path(), Faults::default())).await;
    let app = &second.app;
    // The books as they were, but for where next_action points (another port now).
    let mut after = books(app).await;
    let moved = after.0.iter_mut().find(|p| p.id == waiting.id).unwrap();
    let url = moved
        .next_action
        .take()
        .expect("still awaiting the buyer")
        .url;
    assert!(
        url.ends_with(&format!("/v1/payments/{}/action", waiting.id)),
        "{url}"
    );
    let mut expected = before;
    expected
        .0
        .iter_mut()
        .find(|p| p.id == waiting.id)
        .unwrap()
        .next_action = None;
    assert_eq!(after, expected);
    let captured = app.payment(&captured.id).await;
    assert_eq!(
        (captured.status, captured.amount_captured),
        (PaymentStatus::Succeeded, 400)
    );
    assert_eq!(app.payment(&disputed.id).await.disputes.len(), 1);
    // The keys replay; a second cancel under a new key is still refused.
    let replay = app.capture(&captured.id, "cap:1", part()).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.json::<Payment>().await.unwrap(), captured);
    assert_eq!(app.cancel(&voided.id, "void:1").await.status(), 200);
    assert_eq!(app.cancel(&voided.id, "void:2").await.status(), 409);
    // The buyer can still act on the payment that was waiting.
    let done: Payment = app
        .act(&waiting.id, "succeeded")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(done.status, PaymentStatus::Succeeded);
    second.stop().await;
}
