//! The audit an operator can trust: silent under live traffic, loud about
//! every planted fault — including a charge the PSP holds that no order owns.
//! The incremental audit (what changed since the last recorded run) the same.

use soldonce_tests::saga::{audit_with, Saga, SagaOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn soldonce(args: &[&str], saga: &Saga) -> (Option<i32>, String) {
    soldonce_tests::relay::soldonce(
        args,
        &[
            ("DATABASE_URL", &saga.app.database_url),
            ("PSP_URL", &saga.psp_url),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_under_live_load_reports_nothing_and_names_each_planted_violation() {
    // Compensations stay recorded (not carried out) so the planted charge stays visible.
    let options = SagaOptions {
        faults: r#"{"webhook_duplicates": 2}"#.into(),
        compensation_interval: Duration::from_secs(3600),
        ..SagaOptions::default()
    };
    let saga = Arc::new(Saga::start_with(options).await);
    let app = saga.app.clone();
    app.add_product("LOAD", 100, 1_000_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let placed = Arc::new(AtomicU64::new(0));
    let load = {
        let (saga, stop, placed) = (saga.clone(), stop.clone(), placed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let batch = futures::future::join_all((0..20).map(|_| saga.order("LOAD"))).await;
                for id in batch.iter().step_by(5) {
                    saga.app
                        .post_empty(&saga.app.token, &format!("/v1/orders/{id}/cancel"))
                        .await;
                }
                placed.fetch_add(20, Ordering::Relaxed);
            }
        })
    };
    for run in 0..10 {
        let before = placed.load(Ordering::Relaxed);
        soldonce_tests::eventually("orders to flow", Duration::from_secs(30), || async {
            (placed.load(Ordering::Relaxed) >= before + 20).then_some(())
        })
        .await;
        let report = audit_with(&app, 60, 600).await;
        assert!(
            report.clean(),
            "run {run} under load: {:#?}",
            report.violations
        );
        assert!(report.orders > 0);
        // The periodic audit: a full pass first, then only what changed, each recorded.
        let options = store::audit::AuditOptions {
            shipment_grace: Duration::from_secs(600),
            ..store::audit::AuditOptions::default()
        };
        // Where the last recorded run stopped: the incremental run reads the
        // orders with events or ledger rows past it (or in its holes).
        let since: Option<(i64, Vec<i64>, i64, Vec<i64>)> = sqlx::query_as(
            "SELECT event_position, event_gaps, ledger_id, ledger_gaps FROM audit_checkpoint",
        )
        .fetch_optional(&app.pool)
        .await
        .expect("checkpoint");
        let audit = store::audit::incremental(&app.pool, &options)
            .await
            .expect("incremental audit");
        // Counted apart, after the run: every order that changed since then (a
        // superset of what the run's snapshot held, as orders keep flowing).
        let changed: i64 = match &since {
            None => 0,
            Some((position, gaps, ledger, ledger_gaps)) => sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT stream_id FROM events WHERE type LIKE 'order.%' AND (position > $1 OR position = ANY($2)) \
                 UNION SELECT order_id FROM stock_ledger WHERE order_id IS NOT NULL AND (id > $3 OR id = ANY($4))) changed",
            )
            .bind(position)
            .bind(gaps)
            .bind(ledger)
            .bind(ledger_gaps)
            .fetch_one(&app.pool)
            .await
            .expect("changed orders"),
        };
        let delta = &audit.report;
        assert_eq!(
            delta.kind,
            if run == 0 {
                store::audit::AuditKind::Full
            } else {
                store::audit::AuditKind::Incremental
            },
            "run {run}"
        );
        assert!(
            delta.clean(),
            "incremental run {run} under load: {:#?}",
            delta.violations
        );
        assert!(
            run == 0 || (delta.orders > 0 && delta.orders as i64 <= changed),
            "run {run} read only the orders that changed: {} of the {changed} changed since the last run ({} in the full pass)",
            delta.orders,
            report.orders
        );
        audit.record(&app.pool).await.expect("record the run");
    }
    stop.store(true, Ordering::Relaxed);
    load.await.expect("load");
    assert!(
        placed.load(Ordering::Relaxed) >= 200,
        "the audits ran under load"
    );
    saga.fault_fired("duplicate_webhook", 1.0).await;

    // Plant four faults: an edited bucket, a forged event (under an id
    // already taken), a unit moved to `sold` on an order that did not pay
    // for it (buckets and ledger agree), a charge no order owns.
    sqlx::query("UPDATE stock SET available = available + 3 WHERE sku = 'LOAD'")
        .execute(&app.pool)
        .await
        .expect("edit");
    let cancelled: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM orders WHERE state = 'cancelled' LIMIT 1")
            .fetch_one(&app.pool)
            .await
            .expect("a cancelled order");
    sqlx::query(
        "WITH m AS (UPDATE stock SET available = available - 1, held = held + 1 WHERE sku = 'LOAD'), \
              n AS (UPDATE stock_sold SET sold = sold + 1 WHERE sku = 'LOAD') \
         INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id) VALUES ('LOAD', 'adjust', -1, 0, 1, $1)",
    )
    .bind(cancelled)
    .execute(&app.pool)
    .await
    .expect("a unit sold on a cancelled order");
    let (victim, version): (uuid::Uuid, i32) =
        sqlx::query_as("SELECT id, version FROM orders WHERE state = 'confirmed' LIMIT 1")
            .fetch_one(&app.pool)
            .await
            .expect("a confirmed order");
    // Forged under an id another order's event holds: nothing in the
    // database refuses that since event ids lost their unique index.
    let taken: uuid::Uuid =
        sqlx::query_scalar("SELECT event_id FROM events WHERE stream_id <> $1 LIMIT 1")
            .bind(victim)
            .fetch_one(&app.pool)
            .await
            .expect("another order's event");
    sqlx::query("INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source) VALUES ($1, $2, $3, 'order.cancelled.v1', $4, $2, gen_random_uuid(), 'test')")
        .bind(taken)
        .bind(victim)
        .bind(version + 1)
        .bind(serde_json::json!({ "at": chrono::Utc::now() }))
        .execute(&app.pool)
        .await
        .expect("forge");
    let dropped = saga.faults_injected("drop_webhook").await;
    saga.set_faults(r#"{"drop_webhook_rate": 1.0}"#).await;
    // A charge of soldonce's (its key) landing after its order was cancelled,
    // on an order the worker never charged, once it has nothing left in hand
    // (so that only reconciliation finds the charge).
    saga.wait_worker_idle(Duration::from_secs(60)).await;
    let late: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM orders o WHERE state = 'cancelled' AND id <> $1 AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.order_id = o.id) LIMIT 1")
            .bind(cancelled)
            .fetch_one(&app.pool)
            .await
            .expect("another cancelled order");
    let stray = saga
        .charge_directly(&late.to_string(), 100, "BRL", &format!("pay:{late}"))
        .await;
    let stray_id = stray["id"].as_str().expect("id");
    saga.fault_fired("drop_webhook", dropped + 1.0).await;

    let (code, text) = soldonce(&["--json", "reconcile"], &saga);
    assert_eq!(code, Some(0), "every finding repaired: {text}");
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
    let findings = report["report"]["findings"].as_array().expect("findings");
    assert!(
        findings.iter().any(|f| f["subject"] == stray_id
            && f["kind"] == "unattached_payment"
            && f["repaired"] == true),
        "reconciliation names the stray charge: {text}"
    );
    let (code, text) = soldonce(
        &[
            "audit",
            "--incremental",
            "--compensation-grace",
            "0",
            "--pace",
            "0.5",
        ],
        &saga,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("incremental (events after position"),
        "{text}"
    );
    for (named, what) in [
        ("ledger_drift LOAD".to_owned(), "the edited bucket"),
        (format!("projection_drift {victim}"), "the forged event"),
        (
            format!("order_ledger_drift {cancelled}"),
            "the unit sold on a cancelled order",
        ),
        (
            format!("compensation_overdue {stray_id}"),
            "the stray charge",
        ),
    ] {
        assert!(
            text.contains(&named),
            "the incremental audit names {what}: {text}"
        );
    }
    // The changed orders checked a few at a time, each group in a snapshot of
    // its own: the same violations, each named once.
    let chunked = store::audit::incremental_from_scratch(
        &saga.app.pool,
        &store::audit::AuditOptions {
            compensation_grace: Duration::ZERO,
            chunk: 5,
            ..store::audit::AuditOptions::default()
        },
    )
    .await
    .expect("the chunked audit runs");
    for (check, subject) in [
        ("projection_drift", victim.to_string()),
        ("order_ledger_drift", cancelled.to_string()),
        ("ledger_drift", "LOAD".to_owned()),
    ] {
        let named = chunked
            .violations
            .iter()
            .filter(|v| v.check == check && v.subject == subject)
            .count();
        assert_eq!(
            named, 1,
            "{check} {subject} once: {:#?}",
            chunked.violations
        );
    }
    let (code, last) = soldonce(&["audit", "--last"], &saga);
    assert_eq!(
        code,
        Some(1),
        "the last recorded run had violations: {last}"
    );
    assert!(
        last.contains("incremental") && last.contains("order_ledger_drift: "),
        "{last}"
    );
    let (code, text) = soldonce(&["audit", "--compensation-grace", "0"], &saga);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("sold_mismatch LOAD"),
        "the full pass names the unit sold on a cancelled order: {text}"
    );
    assert!(
        text.contains("ledger_drift LOAD"),
        "names the edited bucket: {text}"
    );
    assert!(
        text.contains(&format!("projection_drift {victim}")),
        "names the forged event: {text}"
    );
    assert!(
        text.contains(&format!(
            "duplicate_event_id {taken}: 2 events share this id"
        )),
        "names the id the forged event took: {text}"
    );
    assert!(
        text.contains(&format!("compensation_overdue {stray_id}"))
            && text.contains("(cancelled, order"),
        "names the stray charge: {text}"
    );
    let (code, text) = soldonce(&["audit", "--compensation-grace", "-1"], &saga);
    assert_eq!(code, Some(2), "bad input is exit 2: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_a_later_fact_resolved_no_longer_fails_the_audit() {
    // The payment worker gave up on an order's `order.placed` (a payment slow
    // for longer than its redeliveries); later the webhook settles the order.
    let saga = Saga::start_with(SagaOptions {
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("SLOW", 2500, 5).await;
    let id = saga.order("SLOW").await;
    sqlx::query(
        "INSERT INTO dead_letters (consumer, stream_seq, subject, payload, reason) \
         VALUES ('payment-worker', 1, $1, '\\x7b7d', 'payment outcome unknown for 20 deliveries')",
    )
    .bind(format!("soldonce.order.placed.{id}"))
    .execute(&app.pool)
    .await
    .expect("plant the dead letter");
    let flagged = |report: &store::audit::AuditReport| {
        report
            .violations
            .iter()
            .any(|v| v.check == "dead_letters" && v.subject == "payment-worker")
    };
    assert!(
        flagged(&audit_with(&app, 600, 600).await),
        "an order still waiting on the letter is a violation"
    );
    assert_eq!(
        soldonce_tests::saga::pay_by_webhook(&app, &id, 2500).await,
        200
    );
    assert_eq!(
        saga.settled_state(&id, Duration::from_secs(30)).await,
        "confirmed"
    );
    let report = audit_with(&app, 600, 600).await;
    assert!(!flagged(&report), "{:#?}", report.violations);
    // The letter itself stays listed for the record.
    assert_eq!(
        app.count("SELECT count(*) FROM dead_letters WHERE redriven_at IS NULL")
            .await,
        1
    );
}
