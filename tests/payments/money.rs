//! Every payment ends attached to one confirmed order or refunded, whichever
//! path brings it to soldonce: the worker's own call, a webhook, or only the
//! reconciliation against the PSP's books.

use soldonce_tests::app::Buckets;
use soldonce_tests::eventually;
use soldonce_tests::saga::{audit_with, redeliver_payment_webhook, Saga, SagaOptions};
use std::time::Duration;

/// How a late charge reaches soldonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The payment worker's own call (by key, after the charge settled).
    Worker,
    /// Only the PSP's webhook: no worker owns the charge.
    Webhook,
    /// Neither: webhooks are lost, only reconciliation finds it.
    Reconcile,
}

impl Path {
    fn learned_from(self) -> &'static str {
        match self {
            Path::Worker => "worker",
            Path::Webhook => "webhook",
            Path::Reconcile => "reconcile",
        }
    }
}

/// How the order ended before its charge landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The buyer cancelled: a cancel is final.
    Cancelled,
    /// It expired, and its one unit was taken by another order.
    ExpiredUnitsGone,
}

async fn state_of(saga: &Saga, id: &str) -> String {
    saga.app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await
        .body["state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

async fn wait_state(saga: &Saga, id: &str, want: &str) {
    eventually(
        &format!("order {id} to be {want}"),
        Duration::from_secs(30),
        || async { (state_of(saga, id).await == want).then_some(()) },
    )
    .await;
}

/// Lets `order` end as `ended`, then charges it at the PSP along `path`; returns the payment id.
async fn end_then_charge(saga: &mut Saga, sku: &str, ended: Ended, path: Path) -> (String, String) {
    let drop_rate = if path == Path::Webhook { 0.0 } else { 1.0 };
    let dropped = saga.faults_injected("drop_webhook").await;
    let plain = serde_json::json!({ "drop_webhook_rate": drop_rate }).to_string();
    if path == Path::Worker {
        // The worker's charge is still processing at the PSP when the order ends.
        saga.set_faults(&serde_json::json!({ "processing_rate": 1.0, "processing_ms": 4000, "drop_webhook_rate": drop_rate }).to_string()).await;
    } else {
        saga.set_faults(&plain).await;
    }
    let order = saga.order(sku).await;
    if path == Path::Worker {
        eventually(
            "the worker's charge to be processing",
            Duration::from_secs(10),
            || async {
                let payments = saga.psp_payments(&order).await;
                (payments
                    .first()
                    .is_some_and(|p| p["status"] == "processing"))
                .then_some(())
            },
        )
        .await;
    }
    match ended {
        Ended::Cancelled => {
            let r = saga
                .app
                .post_empty(&saga.app.token, &format!("/v1/orders/{order}/cancel"))
                .await;
            assert_eq!(
                (r.status, r.body["state"].as_str()),
                (200, Some("cancelled")),
                "{}",
                r.body
            );
        }
        Ended::ExpiredUnitsGone => {
            wait_state(saga, &order, "expired").await;
            saga.set_faults(&plain).await;
            // Another buyer takes the unit (and, with a worker, pays for it).
            let other = saga.order(sku).await;
            if path == Path::Worker {
                wait_state(saga, &other, "confirmed").await;
            }
        }
    }
    let payment = match path {
        Path::Worker => {
            eventually(
                "the late charge to settle",
                Duration::from_secs(10),
                || async {
                    let payments = saga.psp_payments(&order).await;
                    payments
                        .first()
                        .filter(|p| p["status"] == "succeeded")
                        .cloned()
                },
            )
            .await
        }
        Path::Webhook | Path::Reconcile => {
            saga.charge_directly(&order, 2500, "BRL", &format!("pay:{order}"))
                .await
        }
    };
    let payment_id = payment["id"].as_str().expect("payment id").to_owned();
    if path != Path::Webhook {
        // Only the worker or reconciliation can learn of it: its webhook never went out.
        saga.fault_fired("drop_webhook", dropped + 1.0).await;
    }
    (order, payment_id)
}

async fn a_late_charge_is_refunded_exactly_once(ended: Ended, path: Path) {
    let ttl = if ended == Ended::ExpiredUnitsGone {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(900)
    };
    let worker = path == Path::Worker;
    // Money taken at once, so the late charge is refunded (an authorization
    // is voided instead: tests/payments/capture.rs).
    let mut saga = Saga::start_with(SagaOptions {
        ttl,
        worker,
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    let units = if ended == Ended::ExpiredUnitsGone {
        1
    } else {
        5
    };
    app.add_product("TEE", 2500, units).await;
    saga.start_expiry(Duration::from_millis(50)).await;
    let (order, payment_id) = end_then_charge(&mut saga, "TEE", ended, path).await;
    if path == Path::Reconcile {
        let report = payments::reconcile::run(&app.pool, &saga.psp_client(), None, false)
            .await
            .expect("reconcile");
        let found = report
            .findings
            .iter()
            .find(|f| f.subject == payment_id)
            .expect("reconciliation names the payment");
        assert_eq!(
            (found.kind.as_str(), found.repaired),
            ("unattached_payment", true),
            "{found:?}"
        );
    }
    if !worker {
        // Recorded, not yet carried out: the money is not where it belongs, and the audit says so.
        let pending = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND refund_state = 'pending' AND learned_from = '{}'", path.learned_from());
        eventually(
            "the refund to be recorded with the fact",
            Duration::from_secs(10),
            || async { (app.count(&pending).await == 1).then_some(()) },
        )
        .await;
        let audit = audit_with(&app, 0, 600).await;
        assert!(
            audit
                .violations
                .iter()
                .any(|v| v.check == "compensation_overdue" && v.subject == payment_id),
            "{:#?}",
            audit.violations
        );
        saga.start_worker().await;
    }
    wait_state(&saga, &order, "refunded").await;
    let psp = saga.psp_payment(&payment_id).await;
    assert_eq!(psp["status"], "succeeded");
    assert_eq!(
        psp["refunds"].as_array().map(Vec::len),
        Some(1),
        "refunded exactly once at the PSP: {psp}"
    );
    let row = format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND disposition = 'refund' AND refund_state = 'succeeded' AND learned_from = '{}'", path.learned_from());
    assert_eq!(
        app.count(&row).await,
        1,
        "one refunded payment, learned from the {path:?} path"
    );
    let events = |ty: &str| {
        format!("SELECT count(*) FROM events WHERE stream_id = '{order}'::uuid AND type = '{ty}'")
    };
    assert_eq!(
        app.count(&events("order.confirmed.v1")).await,
        0,
        "never confirmed on it"
    );
    assert_eq!(app.count(&events("order.refund_decided.v1")).await, 1);
    assert_eq!(app.count(&events("order.refunded.v1")).await, 1);
    let view = app
        .get(&app.token, &format!("/v1/orders/{order}"))
        .await
        .body;
    assert_eq!(view["refunds"][0]["psp_payment_id"], payment_id.as_str());
    assert_eq!(view["refunds"][0]["state"], "refunded");
    let b = app.buckets("TEE").await;
    match ended {
        Ended::Cancelled => assert_eq!(
            b,
            Buckets {
                available: 5,
                reserved: 0,
                sold: 0
            }
        ),
        // The other buyer's order settles its own way; the unit is never counted twice.
        Ended::ExpiredUnitsGone => assert_eq!(b.available + b.reserved + b.sold, 1, "{b:?}"),
    }
    let audit = audit_with(&app, 0, 600).await;
    assert!(
        audit.clean(),
        "clean once refunded: {:#?}",
        audit.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_a_cancel_reaching_the_worker_is_refunded() {
    a_late_charge_is_refunded_exactly_once(Ended::Cancelled, Path::Worker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_a_cancel_reaching_only_the_webhook_is_refunded() {
    a_late_charge_is_refunded_exactly_once(Ended::Cancelled, Path::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_a_cancel_found_only_by_reconciliation_is_refunded() {
    a_late_charge_is_refunded_exactly_once(Ended::Cancelled, Path::Reconcile).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_expiry_with_the_units_gone_reaching_the_worker_is_refunded() {
    a_late_charge_is_refunded_exactly_once(Ended::ExpiredUnitsGone, Path::Worker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_expiry_with_the_units_gone_reaching_only_the_webhook_is_refunded() {
    a_late_charge_is_refunded_exactly_once(Ended::ExpiredUnitsGone, Path::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_landing_after_expiry_with_the_units_gone_found_only_by_reconciliation_is_refunded(
) {
    a_late_charge_is_refunded_exactly_once(Ended::ExpiredUnitsGone, Path::Reconcile).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_flight_never_lets_its_payment_confirm_when_a_unit_frees_up() {
    let mut saga = Saga::start_with(SagaOptions {
        ttl: Duration::from_secs(2),
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("LAST", 2500, 1).await;
    saga.start_expiry(Duration::from_millis(50)).await;
    let late = saga.order("LAST").await;
    wait_state(&saga, &late, "expired").await;
    let holder = saga.order("LAST").await;
    let payment = saga
        .charge_directly(&late, 2500, "BRL", &format!("pay:{late}"))
        .await;
    let payment_id = payment["id"].as_str().expect("id").to_owned();
    eventually("the refund to be decided", Duration::from_secs(10), || async {
        (app.count(&format!("SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND reason = 'units_gone'")).await == 1).then_some(())
    })
    .await;
    // The unit frees up while the refund is still to be carried out...
    assert_eq!(
        app.post_empty(&app.token, &format!("/v1/orders/{holder}/cancel"))
            .await
            .status,
        200
    );
    assert_eq!(
        app.buckets("LAST").await,
        Buckets {
            available: 1,
            reserved: 0,
            sold: 0
        }
    );
    // ...and the payment is reported again, by a webhook retry and by reconciliation.
    let settled = saga.psp_payment(&payment_id).await;
    assert_eq!(redeliver_payment_webhook(&app, &settled).await, 200);
    payments::reconcile::run(&app.pool, &saga.psp_client(), None, false)
        .await
        .expect("reconcile");
    assert_eq!(
        state_of(&saga, &late).await,
        "expired",
        "never confirmed on a payment whose refund is decided"
    );
    assert_eq!(
        app.buckets("LAST").await,
        Buckets {
            available: 1,
            reserved: 0,
            sold: 0
        }
    );
    // The database refuses it too, whatever the code does.
    let flip = sqlx::query(
        "UPDATE payments SET disposition = 'attached', refund_state = NULL WHERE payment_id = $1",
    )
    .bind(&payment_id)
    .execute(&app.pool)
    .await;
    assert!(flip.is_err(), "a decided refund is final in the database");
    let forged =
        sqlx::query("UPDATE orders SET state = 'confirmed', payment_id = $2 WHERE id = $1::uuid")
            .bind(&late)
            .bind(&payment_id)
            .execute(&app.pool)
            .await;
    assert!(
        forged.is_err(),
        "no order is confirmed on a payment that is not attached to it"
    );
    saga.start_worker().await;
    wait_state(&saga, &late, "refunded").await;
    assert_eq!(
        saga.psp_payment(&payment_id).await["refunds"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(app.count(&format!("SELECT count(*) FROM events WHERE stream_id = '{late}'::uuid AND type = 'order.confirmed.v1'")).await, 0);
    assert!(audit_with(&app, 0, 600).await.clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processing_payment_holds_the_units_until_it_succeeds_and_confirms() {
    let saga = Saga::start(
        r#"{"processing_rate": 1.0, "processing_ms": 1500}"#,
        Duration::from_secs(2),
    )
    .await;
    let app = saga.app.clone();
    app.add_product("MUG", 2500, 3).await;
    let order = saga.order("MUG").await;
    // While the PSP says `processing`, nothing is released.
    let saw_processing = std::sync::atomic::AtomicBool::new(false);
    let state = eventually("the order to settle", Duration::from_secs(30), || async {
        // Read our side first: if the PSP still says processing afterwards,
        // nothing can have settled the order when we looked.
        let state = state_of(&saga, &order).await;
        let buckets = app.buckets("MUG").await;
        let processing = saga
            .psp_payments(&order)
            .await
            .first()
            .is_some_and(|p| p["status"] == "processing");
        if processing {
            saw_processing.store(true, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(
                state, "payment_pending",
                "no verdict while the PSP is processing"
            );
            assert_eq!(
                buckets,
                Buckets {
                    available: 2,
                    reserved: 1,
                    sold: 0
                }
            );
        }
        (state != "payment_pending").then_some(state)
    })
    .await;
    assert!(
        saw_processing.into_inner(),
        "the PSP answered processing first"
    );
    assert_eq!(state, "confirmed");
    assert_eq!(
        app.count("SELECT count(*) FROM stock_ledger WHERE movement = 'release'")
            .await,
        0,
        "never released"
    );
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 2,
            reserved: 0,
            sold: 1
        }
    );
    assert_eq!(saga.psp_payments(&order).await.len(), 1, "charged once");
    assert_eq!(saga.faults_injected("processing").await, 1.0);
}

/// Payments on the shared account that name one of soldonce's orders but
/// were not made with its key (`pay:<order_id>`) — a point of sale taking
/// money for a web order, another system — are not soldonce's to refund,
/// whatever their amount or currency; the order confirms on its own charge.
/// (Mismatched and second payments of soldonce's own: tests/payments/batch.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_naming_an_order_without_its_key_are_left_alone() {
    let mut saga = Saga::start_with(SagaOptions {
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("MUG", 2500, 3).await;
    let order = saga.order("MUG").await;
    let wrong_amount = saga
        .charge_directly(&order, 2400, "BRL", "odd-amount")
        .await;
    let wrong_currency = saga
        .charge_directly(&order, 2500, "USD", "odd-currency")
        .await;
    saga.start_worker().await;
    wait_state(&saga, &order, "confirmed").await;
    let second = saga
        .charge_directly(&order, 2500, "BRL", "second-charge")
        .await;
    let report = payments::reconcile::run(&app.pool, &saga.psp_client(), None, false)
        .await
        .expect("reconcile");
    let odd = [&wrong_amount, &wrong_currency, &second];
    let mut foreign: Vec<&str> = report
        .foreign
        .iter()
        .map(|p| p.payment_id.as_str())
        .collect();
    foreign.sort_unstable();
    let mut want: Vec<&str> = odd.iter().map(|p| p["id"].as_str().expect("id")).collect();
    want.sort_unstable();
    assert_eq!(foreign, want, "reconciliation lists the three as foreign");
    assert!(report.clean(), "{report:#?}");
    saga.wait_worker_idle(Duration::from_secs(30)).await;
    let view = app
        .get(&app.token, &format!("/v1/orders/{order}"))
        .await
        .body;
    assert_eq!(view["state"], "confirmed");
    let own = view["payment"]["psp_payment_id"]
        .as_str()
        .expect("own payment")
        .to_owned();
    assert!(!odd.iter().any(|p| p["id"] == own.as_str()));
    assert_eq!(view["refunds"].as_array().map(Vec::len), Some(0));
    // Counted at the PSP: nothing refunded; and in soldonce's rows: only its own payment.
    for p in saga.psp_payments(&order).await {
        assert_eq!(p["refunds"].as_array().map(Vec::len), Some(0), "{p}");
    }
    assert_eq!(app.count("SELECT count(*) FROM payments").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM foreign_payments").await, 3);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 2,
            reserved: 0,
            sold: 1
        }
    );
    assert!(audit_with(&app, 0, 600).await.clean());
}
