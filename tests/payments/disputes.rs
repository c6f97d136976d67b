//! Disputes (chargebacks): psp-sim's `POST /admin/payments/{id}/dispute`
//! sends a signed `dispute.created` webhook. soldonce records it on the
//! order once (`order.disputed`), holds a shipment that has not shipped, and
//! names the order in the audit until a person acknowledges the finding
//! (`soldonce findings ack`); acknowledging does not release the hold.

use soldonce_tests::app::WEBHOOK_SECRET;
use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, Saga, SagaOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(30);

fn soldonce(args: &[&str], saga: &Saga) -> (Option<i32>, String) {
    soldonce_tests::relay::soldonce(args, &[("DATABASE_URL", &saga.app.database_url)])
}

async fn view(saga: &Saga, order_id: &str) -> serde_json::Value {
    saga.app
        .get(&saga.app.token, &format!("/v1/orders/{order_id}"))
        .await
        .body
}

/// The one payment psp-sim holds for an order, once it reads `status`.
async fn psp_payment_in(saga: &Saga, order_id: &str, status: &str) -> serde_json::Value {
    eventually(
        &format!("{order_id}'s payment {status}"),
        SETTLE,
        || async {
            match &saga.psp_payments(order_id).await[..] {
                [p] if p["status"] == status => Some(p.clone()),
                _ => None,
            }
        },
    )
    .await
}

/// Opens a dispute at psp-sim, as the buyer's bank does; returns it.
async fn dispute(saga: &Saga, payment_id: &str, reason: &str) -> serde_json::Value {
    let url = format!("{}/admin/payments/{payment_id}/dispute", saga.psp_url);
    let body = serde_json::json!({ "reason": reason });
    let r = saga.app.send(saga.app.client.post(url).json(&body)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body
}

/// Delivers `dispute` again in a freshly signed `dispute.created` webhook
/// with a new webhook id (a PSP that re-sent it as a new message).
async fn redeliver_dispute(saga: &Saga, dispute: &serde_json::Value) -> u16 {
    let now = chrono::Utc::now();
    let webhook_id = format!("msg_{}", Uuid::new_v4().simple());
    let body = serde_json::json!({ "type": "dispute.created", "timestamp": now, "data": dispute })
        .to_string();
    let secret = psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret");
    let signature =
        psp_sim::signature::sign(&secret, &webhook_id, now.timestamp(), body.as_bytes());
    let request = saga
        .app
        .client
        .post(saga.app.url("/v1/psp/webhooks"))
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", now.timestamp().to_string())
        .header("webhook-signature", signature)
        .body(body);
    saga.app.send(request).await.status
}

/// The order's view once it shows `n` disputes.
async fn disputed_view(saga: &Saga, order_id: &str, n: usize) -> serde_json::Value {
    eventually("the dispute on the order", SETTLE, || async {
        let order = view(saga, order_id).await;
        (order["disputes"].as_array().map(Vec::len) == Some(n)).then_some(order)
    })
    .await
}

/// The audit's violations: (check, subject).
async fn violations(saga: &Saga) -> Vec<(String, String)> {
    let report = store::audit::run(&saga.app.pool, &store::audit::AuditOptions::default())
        .await
        .expect("audit runs");
    report
        .violations
        .iter()
        .map(|v| (v.check.to_owned(), v.subject.clone()))
        .collect()
}

/// The open findings as `soldonce findings list --json` prints them.
fn open_findings(saga: &Saga) -> Vec<serde_json::Value> {
    let (code, out) = soldonce(&["findings", "list", "--json"], saga);
    assert_eq!(code, Some(0), "{out}");
    serde_json::from_str::<Vec<serde_json::Value>>(out.trim()).expect("a JSON list")
}

async fn shipment_state(saga: &Saga, order_id: &str) -> Option<String> {
    view(saga, order_id).await["shipment"]["state"]
        .as_str()
        .map(str::to_owned)
}

async fn wait_delivered(saga: &Saga, order_id: &str) {
    eventually(&format!("{order_id} to be delivered"), SETTLE, || async {
        (shipment_state(saga, order_id).await.as_deref() == Some("delivered")).then_some(())
    })
    .await;
}

/// Shipment events that took the order's shipment to `shipped`.
async fn shipped_events(saga: &Saga, order_id: &str) -> i64 {
    saga.app
        .count(&format!(
            "SELECT count(*) FROM events e JOIN shipments s ON s.id = e.stream_id \
             WHERE s.order_id = '{order_id}' AND e.type = 'shipment.shipped.v1'"
        ))
        .await
}

/// The dispute arrives before fulfillment runs: while undisputed orders ship
/// past it, the disputed order's shipment never ships, even after the
/// finding is acknowledged; only `--release` lets it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_before_shipment_holds_it_and_is_named_until_acked() {
    let mut saga = Saga::start_with(SagaOptions {
        faults: r#"{"webhook_duplicates": 3, "webhook_reorder": true}"#.into(),
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 10).await;
    let (disputed, other) = (saga.order("MUG").await, saga.order("MUG").await);
    for id in [&disputed, &other] {
        assert_eq!(saga.settled_state(id, SETTLE).await, "confirmed");
    }
    let payment = psp_payment_in(&saga, &disputed, "succeeded").await;
    let payment_id = payment["id"].as_str().expect("payment id");
    let opened = dispute(&saga, payment_id, "fraudulent").await;
    let order = disputed_view(&saga, &disputed, 1).await;
    assert_eq!(order["disputes"][0]["id"], opened["id"], "{order}");
    assert_eq!(order["disputes"][0]["psp_payment_id"], payment_id);
    assert_eq!(order["disputes"][0]["amount_minor"], 2500);
    assert_eq!(order["disputes"][0]["reason"], "fraudulent");
    assert_eq!(order["state"], "confirmed", "a dispute changes no state");
    // The same dispute again, as a new message: nothing more is recorded.
    assert_eq!(redeliver_dispute(&saga, &opened).await, 200);
    saga.app
        .wait_count(
            "every copy of the dispute webhook received",
            "SELECT count(*) FROM webhook_receipts WHERE event_type = 'dispute.created'",
            2,
        )
        .await;
    let once = "SELECT count(*) FROM events WHERE type = 'order.disputed.v1'";
    assert_eq!(saga.app.count(once).await, 1, "one order.disputed event");
    saga.fault_fired("duplicate_webhook", 1.0).await;
    saga.fault_fired("reorder_webhooks", 1.0).await;
    assert_eq!(
        disputed_view(&saga, &disputed, 1).await["disputes"],
        order["disputes"]
    );
    // The warehouse runs: the undisputed order ships, the disputed one never.
    saga.start_fulfillment(Duration::from_millis(50)).await;
    wait_delivered(&saga, &other).await;
    let third = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&third, SETTLE).await, "confirmed");
    wait_delivered(&saga, &third).await;
    let held = shipment_state(&saga, &disputed).await;
    assert!(
        matches!(held.as_deref(), Some("pending" | "picked")),
        "{held:?}"
    );
    assert_eq!(
        shipped_events(&saga, &disputed).await,
        0,
        "held: never shipped"
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM shipment_holds WHERE released_at IS NULL")
            .await,
        1
    );
    let dispute_id = opened["id"].as_str().expect("dispute id");
    named_until_acked_and_held_until_released(&saga, &disputed, dispute_id).await;
}

/// The held order is named by the audit and the CLI until acknowledged;
/// acknowledged, it stays held while others ship, until `--release`.
async fn named_until_acked_and_held_until_released(saga: &Saga, disputed: &str, dispute_id: &str) {
    let once = "SELECT count(*) FROM events WHERE type = 'order.disputed.v1'";
    // Named to a person: by the audit and by the CLI, until acknowledged.
    assert_eq!(
        violations(saga).await,
        [("finding".to_owned(), disputed.to_owned())]
    );
    let open = open_findings(saga);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["order_id"], disputed);
    assert_eq!(open[0]["subject"], dispute_id);
    assert_eq!(open[0]["shipment_held"], true);
    let id = open[0]["id"].to_string();
    let (code, out) = soldonce(
        &[
            "findings",
            "ack",
            &id,
            "--by",
            "ana",
            "--note",
            "evidence sent",
        ],
        saga,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("stays held"), "{out}");
    assert!(open_findings(saga).is_empty());
    assert_audit_clean(&saga.app).await;
    // Acknowledged, still held: another order ships past it again.
    let fourth = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&fourth, SETTLE).await, "confirmed");
    wait_delivered(saga, &fourth).await;
    assert_eq!(shipped_events(saga, disputed).await, 0, "acked, still held");
    let (code, out) = soldonce(&["findings", "ack", &id, "--by", "ana"], saga);
    assert_eq!(code, Some(2), "acknowledged twice: {out}");
    assert!(out.contains("acknowledged already"), "{out}");
    // A person decides to ship it after all.
    let (code, out) = soldonce(&["findings", "ack", &id, "--by", "ana", "--release"], saga);
    assert_eq!(code, Some(0), "{out}");
    wait_delivered(saga, disputed).await;
    assert_eq!(shipped_events(saga, disputed).await, 1);
    assert_eq!(saga.app.count(once).await, 1);
    assert_audit_clean(&saga.app).await;
}

/// Goods already gone cannot be held: the dispute is recorded and named, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_after_shipment_is_recorded_and_named_and_holds_nothing() {
    let mut saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 5).await;
    saga.start_fulfillment(Duration::from_millis(50)).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
    wait_delivered(&saga, &id).await;
    // Captured as it shipped: only captured money can be disputed.
    let payment = psp_payment_in(&saga, &id, "succeeded").await;
    let opened = dispute(
        &saga,
        payment["id"].as_str().expect("id"),
        "product_not_received",
    )
    .await;
    let order = disputed_view(&saga, &id, 1).await;
    assert_eq!(order["disputes"][0]["id"], opened["id"], "{order}");
    assert_eq!(order["shipment"]["state"], "delivered");
    let events = "SELECT count(*) FROM events WHERE type = 'order.disputed.v1'";
    assert_eq!(saga.app.count(events).await, 1);
    assert_eq!(
        saga.app.count("SELECT count(*) FROM shipment_holds").await,
        0
    );
    assert_eq!(
        violations(&saga).await,
        [("finding".to_owned(), id.clone())]
    );
    let open = open_findings(&saga);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["shipment_held"], false);
    let detail = open[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("delivered already"), "{detail}");
    // The projection is the events' fold: a rebuild changes nothing, and restores a lost dispute.
    let pool = &saga.app.pool;
    let mut conn = pool.acquire().await.expect("conn");
    let before = store::projections::snapshot(&mut conn)
        .await
        .expect("snapshot");
    let report = store::projections::rebuild(pool).await.expect("rebuild");
    assert_eq!(report.orders.corrected, 0);
    sqlx::query("UPDATE orders SET disputes = '[]' WHERE id = $1::uuid")
        .bind(&id)
        .execute(pool)
        .await
        .expect("tamper");
    let report = store::projections::rebuild(pool).await.expect("rebuild");
    assert_eq!(report.orders.corrected, 1, "the lost dispute is found");
    let after = store::projections::snapshot(&mut conn)
        .await
        .expect("snapshot");
    assert_eq!(after, before, "and restored");
    let finding = open[0]["id"].to_string();
    let (code, out) = soldonce(&["findings", "ack", &finding, "--by", "ana"], &saga);
    assert_eq!(code, Some(0), "{out}");
    assert_audit_clean(&saga.app).await;
}

/// Bad input changes nothing and exits 2; a dispute of a payment soldonce
/// did not make (a point of sale's, on a shared PSP account) is a receipt only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_bad_input_exits_2_and_a_foreign_dispute_is_a_receipt_only() {
    let saga = Saga::start_with(SagaOptions::default()).await;
    let pos = saga
        .charge_directly("POS-RECEIPT-42", 1200, "BRL", "pos-42")
        .await;
    let pos_id = pos["id"].as_str().expect("id");
    let pos = psp_payment_in(&saga, "POS-RECEIPT-42", "succeeded").await;
    assert_eq!(pos["id"], pos_id);
    dispute(&saga, pos_id, "general").await;
    saga.app
        .wait_count(
            "the foreign dispute's receipt",
            "SELECT count(*) FROM webhook_receipts WHERE event_type = 'dispute.created'",
            1,
        )
        .await;
    assert_eq!(saga.app.count("SELECT count(*) FROM findings").await, 0);
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.disputed.v1'")
            .await,
        0
    );
    for args in [
        &["findings", "ack", "abc", "--by", "ana"][..],
        &["findings", "ack", "0", "--by", "ana"],
        &["findings", "ack", "7"],
        &["findings", "ack", "7", "--by", " "],
        &["findings", "ack", "7", "--by", "ana"],
        &["findings", "list", "--limit", "0"],
    ] {
        let (code, out) = soldonce(args, &saga);
        assert_eq!(code, Some(2), "{args:?}: {out}");
        assert_eq!(out.trim().lines().count(), 1, "{args:?}: one line: {out}");
    }
    assert!(soldonce(&["findings", "ack", "7", "--by", "ana"], &saga)
        .1
        .contains("no finding 7"));
    assert_eq!(saga.app.count("SELECT count(*) FROM findings").await, 0);
    assert!(open_findings(&saga).is_empty());
    assert_audit_clean(&saga.app).await;
}

/// Opens a dispute of `amount_minor` at psp-sim; returns it.
async fn dispute_part(saga: &Saga, payment_id: &str, amount_minor: i64) -> serde_json::Value {
    let url = format!("{}/admin/payments/{payment_id}/dispute", saga.psp_url);
    let body = serde_json::json!({ "amount_minor": amount_minor, "reason": "fraudulent" });
    let r = saga.app.send(saga.app.client.post(url).json(&body)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body
}

/// `soldonce findings ack ID --by ana --release` of the open finding about `dispute_id`.
fn release(saga: &Saga, dispute_id: &str) {
    let open = open_findings(saga);
    let finding = open
        .iter()
        .find(|f| f["subject"] == dispute_id)
        .unwrap_or_else(|| panic!("a finding of {dispute_id}: {open:?}"));
    let id = finding["id"].to_string();
    let (code, out) = soldonce(&["findings", "ack", &id, "--by", "ana", "--release"], saga);
    assert_eq!(code, Some(0), "{out}");
}

/// Two disputes of one payment hold its shipment twice: releasing one
/// leaves the other standing. An order a dispute holds can still end: an
/// operator cancels it, giving back none of what the bank took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dispute_holds_its_shipment_and_a_held_order_can_be_cancelled() {
    let mut saga = Saga::start_with(SagaOptions {
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 10).await;
    let (twice, cancelled) = (saga.order("MUG").await, saga.order("MUG").await);
    for id in [&twice, &cancelled] {
        assert_eq!(saga.settled_state(id, SETTLE).await, "confirmed");
    }
    let paid = psp_payment_in(&saga, &twice, "succeeded").await;
    let first = dispute_part(&saga, paid["id"].as_str().expect("id"), 1000).await;
    let second = dispute_part(&saga, paid["id"].as_str().expect("id"), 1500).await;
    disputed_view(&saga, &twice, 2).await;
    let other = psp_payment_in(&saga, &cancelled, "succeeded").await;
    let other_id = other["id"].as_str().expect("id").to_owned();
    dispute(&saga, &other_id, "fraudulent").await;
    disputed_view(&saga, &cancelled, 1).await;
    let holds = |order: &str| {
        format!("SELECT count(*) FROM shipment_holds WHERE order_id = '{order}' AND released_at IS NULL")
    };
    assert_eq!(
        saga.app.count(&holds(&twice)).await,
        2,
        "one hold per dispute"
    );

    // The warehouse runs; one dispute's hold is released: the other still holds.
    saga.start_fulfillment(Duration::from_millis(50)).await;
    release(&saga, first["id"].as_str().expect("id"));
    let witness = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&witness, SETTLE).await, "confirmed");
    wait_delivered(&saga, &witness).await;
    assert_eq!(
        shipped_events(&saga, &twice).await,
        0,
        "still held by the second dispute"
    );
    assert_eq!(saga.app.count(&holds(&twice)).await, 1);

    // The other held order is cancelled: its unit back, its shipment stopped,
    // no money given back (the bank took it), its finding left for a person.
    let (code, out) = soldonce(&["order", "cancel", &cancelled, "--by", "ana"], &saga);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(view(&saga, &cancelled).await["state"], "cancelled");
    assert_eq!(
        shipment_state(&saga, &cancelled).await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        saga.app.count(&holds(&cancelled)).await,
        0,
        "a moot hold released"
    );
    assert_eq!(
        saga.app
            .count(&format!(
                "SELECT count(*) FROM operator_refunds WHERE order_id = '{cancelled}'"
            ))
            .await,
        0,
        "nothing decided back of a disputed payment"
    );
    let other = saga.psp_payment(&other_id).await;
    assert_eq!(
        other["refunds"].as_array().map(Vec::len),
        Some(0),
        "{other}"
    );
    assert!(open_findings(&saga)
        .iter()
        .any(|f| f["order_id"] == cancelled.as_str()));
    // Sold: the witness only (the held order's unit is still sold; the cancelled one's back).
    assert_eq!(saga.app.buckets("MUG").await.sold, 2);

    // The second dispute released too: now it ships.
    release(&saga, second["id"].as_str().expect("id"));
    wait_delivered(&saga, &twice).await;
    assert_eq!(shipped_events(&saga, &twice).await, 1);
    for f in open_findings(&saga) {
        let (code, out) = soldonce(
            &["findings", "ack", &f["id"].to_string(), "--by", "ana"],
            &saga,
        );
        assert_eq!(code, Some(0), "{out}");
    }
    saga.wait_quiescent(SETTLE).await;
    assert_audit_clean(&saga.app).await;
}

/// A dispute that arrives before soldonce learned its payment is a receipt
/// only; reconciliation, learning the payment, records the dispute too —
/// held before the warehouse could ship it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_of_a_payment_not_yet_learned_is_recorded_by_reconciliation() {
    let mut saga = Saga::start_with(SagaOptions {
        faults: r#"{"drop_webhook_rate": 1.0}"#.into(),
        worker: false,
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let (disputed, witness) = (saga.order("MUG").await, saga.order("MUG").await);
    let mut paid = vec![];
    for id in [&disputed, &witness] {
        let p = saga
            .charge_directly(id, 2500, "BRL", &format!("pay:{id}"))
            .await;
        paid.push(p["id"].as_str().expect("id").to_owned());
    }
    // Neither charge's webhook went out.
    saga.fault_fired("drop_webhook", 2.0).await;
    // The dispute's webhook reaches checkout before anything taught it the payment.
    let opened = dispute(&saga, &paid[0], "fraudulent").await;
    assert_eq!(redeliver_dispute(&saga, &opened).await, 200);
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.disputed.v1'")
            .await,
        0,
        "a payment soldonce does not hold yet: a receipt only"
    );
    let report = payments::reconcile::run(&saga.app.pool, &saga.psp_client(), None, false)
        .await
        .expect("reconcile");
    let found = report
        .findings
        .iter()
        .find(|f| f.kind == "unrecorded_dispute")
        .unwrap_or_else(|| panic!("the dispute recorded: {:?}", report.findings));
    assert!(found.repaired, "{found:?}");
    let order = disputed_view(&saga, &disputed, 1).await;
    assert_eq!(order["state"], "confirmed", "{order}");
    assert_eq!(order["disputes"][0]["id"], opened["id"]);
    // Run again: nothing recorded twice.
    payments::reconcile::run(&saga.app.pool, &saga.psp_client(), None, false)
        .await
        .expect("reconcile");
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.disputed.v1'")
            .await,
        1
    );
    saga.start_fulfillment(Duration::from_millis(50)).await;
    assert_eq!(saga.settled_state(&witness, SETTLE).await, "confirmed");
    wait_delivered(&saga, &witness).await;
    assert_eq!(
        shipped_events(&saga, &disputed).await,
        0,
        "held, never shipped"
    );
    assert_eq!(
        violations(&saga).await,
        [("finding".to_owned(), disputed.clone())]
    );
}

/// Refunds `amount_minor` of `payment_id` at psp-sim under `key`, as its
/// dashboard or another system on the account would.
async fn refund_at_psp(saga: &Saga, payment_id: &str, amount_minor: i64, key: &str) {
    let url = format!("{}/v1/payments/{payment_id}/refunds", saga.psp_url);
    let request = saga
        .app
        .client
        .post(url)
        .header("idempotency-key", key)
        .json(&serde_json::json!({ "amount_minor": amount_minor }));
    let r = saga.app.send(request).await;
    assert!(r.status == 201 || r.status == 200, "{}", r.body);
}

/// A refund soldonce did not make is named and holds the shipment, once
/// however often reported; an operator's own refund is not named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_made_elsewhere_holds_the_shipment_and_is_named_and_an_operator_refund_is_not() {
    let mut saga = Saga::start_with(SagaOptions {
        faults: r#"{"webhook_duplicates": 2}"#.into(),
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let (elsewhere, operator) = (saga.order("MUG").await, saga.order("MUG").await);
    for id in [&elsewhere, &operator] {
        assert_eq!(saga.settled_state(id, SETTLE).await, "confirmed");
    }
    // An operator refunds part of one order: soldonce's own, named nowhere.
    let (code, out) = soldonce(
        &[
            "order",
            "refund",
            &operator,
            "--amount-minor",
            "700",
            "--key",
            "t-1",
        ],
        &saga,
    );
    assert_eq!(code, Some(0), "{out}");
    saga.app
        .wait_count(
            "the operator refund made",
            "SELECT count(*) FROM operator_refunds WHERE state = 'succeeded'",
            1,
        )
        .await;
    // Someone refunds part of the other at the PSP's dashboard.
    let paid = psp_payment_in(&saga, &elsewhere, "succeeded").await;
    refund_at_psp(&saga, paid["id"].as_str().expect("id"), 1000, "dashboard-1").await;
    let once = "SELECT count(*) FROM events WHERE type = 'order.refunded_elsewhere.v1'";
    saga.app.wait_count("the refund recorded", once, 1).await;
    // Every copy of every refund webhook answered: still one event, one finding.
    eventually("every refund webhook answered", SETTLE, || async {
        let answered = saga
            .psp_metric("psp_sim_webhook_attempts_total{result=\"acknowledged\"}")
            .await;
        (answered >= 8.0).then_some(())
    })
    .await;
    saga.fault_fired("duplicate_webhook", 1.0).await;
    assert_eq!(saga.app.count(once).await, 1);
    let open = open_findings(&saga);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["kind"], "refund_elsewhere");
    assert_eq!(open[0]["order_id"], elsewhere.as_str());
    assert_eq!(open[0]["shipment_held"], true);
    assert_eq!(view(&saga, &elsewhere).await["state"], "confirmed");
    assert_eq!(
        violations(&saga).await,
        [("finding".to_owned(), elsewhere.clone())]
    );
    // The warehouse runs: the operator-refunded order ships, the other is held.
    saga.start_fulfillment(Duration::from_millis(50)).await;
    wait_delivered(&saga, &operator).await;
    assert_eq!(shipped_events(&saga, &elsewhere).await, 0, "held");
    // A person decides it ships after all.
    let id = open[0]["id"].to_string();
    let (code, out) = soldonce(&["findings", "ack", &id, "--by", "ana", "--release"], &saga);
    assert_eq!(code, Some(0), "{out}");
    wait_delivered(&saga, &elsewhere).await;
    saga.wait_quiescent(SETTLE).await;
    assert_audit_clean(&saga.app).await;
}
