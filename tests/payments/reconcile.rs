//! Reconciliation and compensation against what the PSP answers: a payment
//! already refunded elsewhere completes its compensation instead of
//! retrying a `409` for ever; a fact that cannot be recorded is named and
//! the walk (and its cursor) goes on; a decline is not learned again.

use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, psp_listing, Saga, SagaOptions};
use std::time::Duration;

async fn state_of(saga: &Saga, id: &str) -> String {
    let view = saga
        .app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await;
    view.body["state"].as_str().unwrap_or("").to_owned()
}

/// A worker-less saga owing a refund: an order cancelled before its
/// payment of 2,500 (made with soldonce's key) arrived; returns the saga,
/// the order and the payment.
async fn refund_owed() -> (Saga, String, String) {
    let saga = Saga::start_with(SagaOptions {
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("MUG", 2500, 3).await;
    let order = saga.order("MUG").await;
    let cancel = app
        .post_empty(&app.token, &format!("/v1/orders/{order}/cancel"))
        .await;
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    let payment = saga
        .charge_directly(&order, 2500, "BRL", &format!("pay:{order}"))
        .await;
    let payment_id = payment["id"].as_str().expect("id").to_owned();
    (saga, order, payment_id)
}

/// The PSP answers the refund `409 …:refund-exceeds-remaining`: someone
/// refunded the whole payment at its dashboard. That refund is the
/// compensation's: recorded, never asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_already_made_at_the_psp_completes_the_compensation() {
    let (mut saga, order, payment_id) = refund_owed().await;
    let app = saga.app.clone();
    // The webhook records the refund; nobody carries it out yet.
    let decided = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND refund_state = 'pending'");
    app.wait_count("the refund to be decided", &decided, 1)
        .await;
    // Its `refund.succeeded` webhook is lost: only the worker's refund call learns of it.
    let dropped = saga.faults_injected("drop_webhook").await;
    saga.set_faults(r#"{"drop_webhook_rate": 1.0}"#).await;
    let request = app
        .client
        .post(format!("{}/v1/payments/{payment_id}/refunds", saga.psp_url))
        .header("idempotency-key", "dashboard-refund-1")
        .json(&serde_json::json!({}));
    let elsewhere = app.send(request).await;
    assert_eq!(elsewhere.status, 201, "{}", elsewhere.body);
    let elsewhere = elsewhere.body["id"].as_str().expect("refund id").to_owned();
    saga.fault_fired("drop_webhook", dropped + 1.0).await;
    saga.start_worker().await;
    let done = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND refund_state = 'succeeded' AND refund_id = '{elsewhere}'");
    app.wait_count("the compensation to complete on that refund", &done, 1)
        .await;
    eventually(
        "the order to be refunded",
        Duration::from_secs(10),
        || async { (state_of(&saga, &order).await == "refunded").then_some(()) },
    )
    .await;
    // Counted at the PSP: the one refund made there, none by soldonce.
    let refunds = psp_listing(&app, &saga.psp_url, "refunds").await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(refunds[0]["id"], elsewhere.as_str());
    let attempts =
        format!("SELECT attempts::bigint FROM payments WHERE payment_id = '{payment_id}'");
    assert_eq!(app.count(&attempts).await, 1, "asked once, not retried");
    assert_audit_clean(&app).await;
}

/// Someone refunded part of a payment at the PSP's dashboard while soldonce
/// owed the buyer the whole of it. That refund's webhook must not close the
/// compensation: soldonce still owes the rest, and its own refund (of
/// everything the payment still holds) gives it back, so the buyer ends with
/// exactly the payment back, never less and never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_refund_made_elsewhere_never_closes_the_compensation() {
    let (mut saga, order, payment_id) = refund_owed().await;
    let app = saga.app.clone();
    let decided = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND refund_state = 'pending'");
    app.wait_count("the refund to be decided", &decided, 1)
        .await;
    let request = app
        .client
        .post(format!("{}/v1/payments/{payment_id}/refunds", saga.psp_url))
        .header("idempotency-key", "dashboard-partial-1")
        .json(&serde_json::json!({ "amount_minor": 1000 }));
    let partial = app.send(request).await;
    assert_eq!(partial.status, 201, "{}", partial.body);
    // Its webhook has been taken in (receipts are written after the refund is looked at).
    app.wait_count(
        "the partial refund's webhook to be received",
        "SELECT count(*) FROM webhook_receipts WHERE event_type = 'refund.succeeded'",
        1,
    )
    .await;
    assert_eq!(
        app.count(&decided).await,
        1,
        "a partial refund leaves the compensation owed"
    );
    saga.start_worker().await;
    let done = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND refund_state = 'succeeded'");
    app.wait_count("soldonce's refund of the rest to complete it", &done, 1)
        .await;
    eventually(
        "the order to be refunded",
        Duration::from_secs(10),
        || async { (state_of(&saga, &order).await == "refunded").then_some(()) },
    )
    .await;
    // Counted at the PSP: the partial refund and soldonce's of the rest, the whole payment.
    let refunds = psp_listing(&app, &saga.psp_url, "refunds").await;
    let mut amounts: Vec<i64> = refunds
        .iter()
        .filter(|r| r["payment_id"] == payment_id.as_str())
        .filter_map(|r| r["amount_minor"].as_i64())
        .collect();
    amounts.sort_unstable();
    assert_eq!(amounts, vec![1000, 1500], "{refunds:?}");
    assert_audit_clean(&app).await;
}

/// One payment whose fact the database refuses (here a trigger stands in
/// for any such fault) is named, and the run records the others and moves
/// its cursor; the next run, with the cursor past it, asks for it again.
/// Declines already recorded are not learned again: a second run finishes
/// while another transaction holds the declined order's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_that_cannot_be_recorded_is_named_and_the_walk_goes_on() {
    let saga = Saga::start_with(SagaOptions {
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("MUG", 2500, 3).await;
    saga.set_faults(r#"{"drop_webhook_rate": 1.0}"#).await;
    let (stuck, fine, declined) = (
        saga.order("MUG").await,
        saga.order("MUG").await,
        saga.order("MUG").await,
    );
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
         CREATE TRIGGER refuse_one BEFORE INSERT ON payments FOR EACH ROW WHEN (NEW.order_id = '{stuck}') EXECUTE FUNCTION refuse_payment();"
    ))
    .execute(&app.pool)
    .await
    .expect("trigger");
    let stuck_pay = saga
        .charge_directly(&stuck, 2500, "BRL", &format!("pay:{stuck}"))
        .await;
    let stuck_pay = stuck_pay["id"].as_str().expect("id").to_owned();
    saga.charge_directly(&fine, 2500, "BRL", &format!("pay:{fine}"))
        .await;
    saga.set_faults(r#"{"drop_webhook_rate": 1.0, "decline_rate": 1.0}"#)
        .await;
    let decline = saga
        .charge_directly(&declined, 2500, "BRL", &format!("pay:{declined}"))
        .await;
    assert_eq!(decline["status"], "failed", "{decline}");
    assert_eq!(saga.faults_injected("decline").await, 1.0);
    // No webhook told checkout of any of the three: only reconciliation can.
    saga.fault_fired("drop_webhook", 3.0).await;
    let psp = saga.psp_client();

    let first = payments::reconcile::run(&app.pool, &psp, None, true)
        .await
        .expect("the run goes on past the payment it cannot record");
    let named: Vec<(&str, &str)> = first
        .findings
        .iter()
        .filter(|f| !f.repaired)
        .map(|f| (f.kind.as_str(), f.subject.as_str()))
        .collect();
    assert_eq!(
        named,
        [("unrecordable_payment", stuck_pay.as_str())],
        "{first:#?}"
    );
    assert_eq!(state_of(&saga, &fine).await, "confirmed");
    assert_eq!(state_of(&saga, &declined).await, "payment_failed");
    assert_eq!(state_of(&saga, &stuck).await, "payment_pending");
    assert_eq!(
        app.count("SELECT count(*) FROM reconcile_state WHERE cursor_time IS NOT NULL")
            .await,
        1,
        "the cursor moved"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM reconcile_findings WHERE kind = 'unrecordable_payment'")
            .await,
        1,
        "the audit names it"
    );

    // The declined order's row is held: learning the decline again would wait on it.
    let mut holder = app.pool.begin().await.expect("tx");
    sqlx::query("SELECT 1 FROM orders WHERE id = $1::uuid FOR UPDATE")
        .bind(&declined)
        .execute(&mut *holder)
        .await
        .expect("lock");
    let again = tokio::time::timeout(
        Duration::from_secs(20),
        payments::reconcile::run(&app.pool, &psp, None, false),
    )
    .await
    .expect("a decline already recorded is not learned again")
    .expect("second run");
    holder.rollback().await.expect("release");
    assert!(
        again
            .findings
            .iter()
            .any(|f| f.subject == stuck_pay && !f.repaired),
        "{again:#?}"
    );
    sqlx::raw_sql("DROP TRIGGER refuse_one ON payments")
        .execute(&app.pool)
        .await
        .expect("drop trigger");
    // Past every payment: only the payment named last time is asked for again.
    let later = Some(chrono::Utc::now() + chrono::Duration::seconds(1));
    let second = payments::reconcile::run(&app.pool, &psp, later, true)
        .await
        .expect("third run");
    assert_eq!(second.payments_seen, 1, "{second:#?}");
    assert!(second.clean(), "{second:#?}");
    assert!(
        second
            .findings
            .iter()
            .any(|f| f.subject == stuck_pay && f.kind == "unrecorded_payment"),
        "{second:#?}"
    );
    // Counted in soldonce's rows and at the PSP: two confirmed on their charges, nothing refunded.
    assert_eq!(state_of(&saga, &stuck).await, "confirmed");
    assert_eq!(
        app.count("SELECT count(*) FROM payments WHERE disposition = 'attached'")
            .await,
        2
    );
    assert!(psp_listing(&app, &saga.psp_url, "refunds").await.is_empty());
    let books = psp_listing(&app, &saga.psp_url, "payments").await;
    assert_eq!(
        books.iter().filter(|p| p["status"] == "succeeded").count(),
        2
    );
    assert_audit_clean(&app).await;
}
