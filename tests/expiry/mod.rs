//! Every reservation ends: expiry, cancellation, late payments, audit.

mod clock;

use futures::stream::{self, StreamExt};
use soldonce_tests::app::Buckets;
use soldonce_tests::relay::binary;
use soldonce_tests::saga::{assert_audit_clean, pay_by_webhook, spawn_expiry, Saga};
use soldonce_tests::{eventually, TestApp};
use std::sync::Arc;
use std::time::Duration;

async fn wait_no_pending(app: &TestApp, within: Duration) {
    eventually("no order left payment_pending", within, || async {
        (app.count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
            .await
            == 0)
            .then_some(())
    })
    .await;
}

/// Every unit of `sku` is available again: none reserved, none sold.
async fn assert_all_available(app: &TestApp, sku: &str, units: i64) {
    let (available, reserved, sold) = (units, 0, 0);
    assert_eq!(
        app.buckets(sku).await,
        Buckets {
            available,
            reserved,
            sold
        },
        "{sku}"
    );
}

/// Until every reservation's window has passed.
async fn wait_past_windows(app: &TestApp) {
    app.wait_count(
        "every reservation past its window",
        "SELECT count(*) FROM orders WHERE expires_at > now()",
        0,
    )
    .await;
}

/// `n` orders were released, each once: one release in the ledger and one
/// `order.expired` event per order.
async fn assert_released_once(app: &TestApp, n: i64) {
    assert_eq!(
        app.count("SELECT count(*) FROM stock_ledger WHERE movement = 'release'")
            .await,
        n,
        "one release per order"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'order.expired.v1'")
            .await,
        n,
        "one expired event per order"
    );
}

async fn place_many(app: &Arc<TestApp>, sku: &str, n: usize) -> Vec<String> {
    stream::iter(0..n)
        .map(|_| {
            let app = app.clone();
            let sku = sku.to_owned();
            async move {
                let r = app.buy_retrying(&sku, 1).await;
                assert_eq!(r.status, 202, "{}", r.body);
                r.body["id"].as_str().expect("id").to_owned()
            }
        })
        .buffer_unordered(50)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_37_unpaid_flash_sale_orders_are_released_after_the_ttl() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(2)).await);
    app.add_product("FLASH", 4990, 200).await;
    let ids = place_many(&app, "FLASH", 200).await;
    for id in &ids[..163] {
        assert_eq!(pay_by_webhook(&app, id, 4990).await, 200);
    }
    let _expiry = spawn_expiry(&app.database_url, Duration::from_millis(100)).await;
    wait_no_pending(&app, Duration::from_secs(30)).await;
    assert_eq!(
        app.buckets("FLASH").await,
        Buckets {
            available: 37,
            reserved: 0,
            sold: 163
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE state = 'expired'")
            .await,
        37
    );
    assert_eq!(
        app.count("SELECT count(*) FROM stock_ledger WHERE movement = 'release'")
            .await,
        37
    );
    assert_audit_clean(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_expiry_instances_release_each_order_exactly_once() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(1)).await);
    app.add_product("A", 100, 400).await;
    place_many(&app, "A", 300).await;
    let _one = spawn_expiry(&app.database_url, Duration::from_millis(20)).await;
    let _two = spawn_expiry(&app.database_url, Duration::from_millis(20)).await;
    wait_no_pending(&app, Duration::from_secs(30)).await;
    assert_released_once(&app, 300).await;
    assert_all_available(&app, "A", 400).await;
    assert_audit_clean(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_concurrent_release_loops_release_each_order_once_and_report_the_count() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(1)).await);
    for sku in ["A", "B", "C"] {
        app.add_product(sku, 100, 150).await;
    }
    for sku in ["A", "B", "C"] {
        place_many(&app, sku, 100).await;
    }
    wait_past_windows(&app).await;
    // Batches of 10 over 300 orders: the four loops claim around each other many times.
    let released = expiry::release_overdue(&app.pool, 10, 4, &expiry::SetAside::default())
        .await
        .expect("release");
    assert_eq!(released, 300, "the loops' own count");
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE state = 'payment_pending'")
            .await,
        0,
        "nothing overdue is left behind"
    );
    assert_released_once(&app, 300).await;
    for sku in ["A", "B", "C"] {
        assert_all_available(&app, sku, 150).await;
    }
    // A second run finds nothing to do.
    assert_eq!(
        expiry::release_overdue(&app.pool, 10, 4, &expiry::SetAside::default())
            .await
            .expect("release"),
        0
    );
    assert_audit_clean(&app).await;
}

/// The release loops run at once: while one loop's release waits for a
/// SKU's stock row (held here, as a long transaction on a hot SKU would),
/// the other loop goes on releasing the orders of another SKU. One loop
/// alone would claim the held SKU's order first (it expired first) and
/// release nothing else until the row was free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_loop_waiting_for_a_stock_row_does_not_hold_back_the_other_loop() {
    let app = Arc::new(TestApp::spawn_with_ttl(Duration::from_secs(1)).await);
    app.add_product("HELD", 100, 5).await;
    app.add_product("FREE", 100, 50).await;
    let held = place_many(&app, "HELD", 1).await;
    place_many(&app, "FREE", 10).await;
    wait_past_windows(&app).await;
    let mut hold = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM stock WHERE sku = 'HELD' FOR UPDATE")
        .execute(&mut *hold)
        .await
        .expect("hold the stock row");
    // Batches of one order, two loops: one claims the held SKU's order and waits.
    let run = tokio::spawn({
        let app = app.clone();
        async move { expiry::release_overdue(&app.pool, 1, 2, &expiry::SetAside::default()).await }
    });
    let free_expired = "SELECT count(*) FROM orders o JOIN order_lines l ON l.order_id = o.id \
                        WHERE l.sku = 'FREE' AND o.state = 'expired'";
    eventually(
        "the other SKU's orders released while the held row waits",
        Duration::from_secs(30),
        || async { (app.count(free_expired).await == 10).then_some(()) },
    )
    .await;
    let state: String = sqlx::query_scalar("SELECT state FROM orders WHERE id = $1::uuid")
        .bind(&held[0])
        .fetch_one(&app.pool)
        .await
        .expect("the held SKU's order");
    assert_eq!(state, "payment_pending", "its release waits for the row");
    hold.rollback().await.expect("free the stock row");
    let released = run.await.expect("join").expect("release");
    assert_eq!(released, 11, "the loops' own count");
    assert_released_once(&app, 11).await;
    assert_all_available(&app, "HELD", 5).await;
    assert_audit_clean(&app).await;
}

/// Most rounds of racing orders, run until both endings have been seen.
const RACE_ROUNDS: u32 = 6;
const RACERS_PER_ROUND: usize = 50;

/// Each order's payment webhook sent, and its cancel a moment after: 0 ms
/// for the first order of a round, one step more for each next (2 ms
/// steps, doubled each round). A cancel sent at once always wins (checkout
/// looks for the worker's record of a payment for about 40 ms before it
/// takes the order itself); one sent late enough loses; in between they
/// race. Whichever comes first wins, and a cancel is final: a payment that
/// lands after it is never confirmed on, but owed back (a refund decided
/// with the webhook's receipt, pending as no worker runs here). Rounds run
/// until both endings have happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_payment_ends_confirmed_or_cancelled_with_a_refund_owed() {
    let app = Arc::new(TestApp::spawn().await);
    let (mut confirmed, mut cancelled, mut rounds) = (0, 0, 0);
    while rounds < RACE_ROUNDS && (confirmed == 0 || cancelled == 0) {
        let step = Duration::from_millis(2) * 2u32.pow(rounds);
        let (won_by_payment, won_by_cancel) = race_round(&app, rounds, step).await;
        confirmed += won_by_payment;
        cancelled += won_by_cancel;
        rounds += 1;
    }
    eprintln!(
        "cancel racing payment: {confirmed} confirmed, {cancelled} cancelled in {rounds} round(s)"
    );
    assert!(
        confirmed > 0 && cancelled > 0,
        "both endings within {RACE_ROUNDS} rounds of {RACERS_PER_ROUND}: {confirmed} confirmed, {cancelled} cancelled"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'order.confirmed.v1' AND (data->>'reactivated')::bool").await,
        0,
        "no cancelled order confirmed again"
    );
    assert_audit_clean(&app).await;
}

/// One round of racing orders of a SKU of its own, the `i`th order's cancel
/// sent `i × step` after its payment; checks every order ended one way or
/// the other, counted from the answers and the rows, and returns how many
/// were confirmed and how many cancelled.
async fn race_round(app: &Arc<TestApp>, round: u32, step: Duration) -> (i64, i64) {
    let sku = format!("RACE-{round}");
    app.add_product(&sku, 1000, RACERS_PER_ROUND as i64).await;
    let ids = place_many(app, &sku, RACERS_PER_ROUND).await;
    let races: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (app, id) = (app.clone(), id.clone());
            let offset = step * u32::try_from(i).expect("a small round");
            tokio::spawn(async move {
                let path = format!("/v1/orders/{id}/cancel");
                // The race's one variable: how long after the payment the cancel is sent.
                let cancel = async {
                    tokio::time::sleep(offset).await;
                    app.post_empty(&app.token, &path).await
                };
                let (paid, cancelled) = tokio::join!(pay_by_webhook(&app, &id, 1000), cancel);
                assert!(
                    cancelled.status == 200 || cancelled.status == 409,
                    "cancel: {}",
                    cancelled.body
                );
                assert_eq!(paid, 200);
                cancelled.status
            })
        })
        .collect();
    let mut answers = Vec::new();
    for race in races {
        answers.push(race.await.expect("race"));
    }
    let in_round = |state: &str| {
        format!(
            "SELECT count(*) FROM orders o JOIN order_lines l ON l.order_id = o.id \
             WHERE l.sku = '{sku}' AND o.state = '{state}'"
        )
    };
    let confirmed = app.count(&in_round("confirmed")).await;
    let cancelled = app.count(&in_round("cancelled")).await;
    assert_eq!(
        (confirmed + cancelled) as usize,
        RACERS_PER_ROUND,
        "round {round}"
    );
    // The buyers' answers say the same: a cancel that lost to the payment is 409.
    let refused = answers.iter().filter(|s| **s == 409).count() as i64;
    assert_eq!(
        (refused, RACERS_PER_ROUND as i64 - refused),
        (confirmed, cancelled),
        "round {round}: cancels refused and taken, against confirmed and cancelled orders"
    );
    assert_eq!(
        app.buckets(&sku).await,
        Buckets {
            available: cancelled,
            reserved: 0,
            sold: confirmed
        },
        "round {round}"
    );
    let of_round = |payments: &str| {
        format!(
            "SELECT count(*) FROM payments p WHERE {payments} AND EXISTS \
             (SELECT 1 FROM order_lines l WHERE l.order_id = p.order_id AND l.sku = '{sku}')"
        )
    };
    let owed = app
        .count(&of_round(
            "p.disposition = 'refund' AND p.reason = 'cancelled' AND p.refund_state = 'pending'",
        ))
        .await;
    assert_eq!(
        owed, cancelled,
        "round {round}: every payment after a cancel is owed back"
    );
    assert_eq!(
        app.count(&of_round("p.disposition = 'attached'")).await,
        confirmed,
        "round {round}"
    );
    (confirmed, cancelled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_payment_whose_unit_was_resold_is_refunded_and_the_other_reclaims_it() {
    let saga = Saga::start_with_ttl(
        r#"{"latency_ms": 1500}"#,
        Duration::from_secs(5),
        Duration::from_millis(300),
    )
    .await;
    let app = saga.app.clone();
    app.add_product("LAST", 4990, 1).await;
    let _expiry = spawn_expiry(&app.database_url, Duration::from_millis(50)).await;
    let first = saga.order("LAST").await;
    eventually(
        "the first order to expire",
        Duration::from_secs(10),
        || async {
            let r = app.get(&app.token, &format!("/v1/orders/{first}")).await;
            (r.body["state"] == "expired").then_some(())
        },
    )
    .await;
    let second = saga.order("LAST").await;
    // Both reservations lapse before their payments land: the first
    // authorization to arrive reclaims the unit, the other finds it gone and
    // is voided (nothing was taken; the order stays expired).
    let views = eventually("both orders to end", Duration::from_secs(30), || async {
        let mut views = vec![];
        for id in [&first, &second] {
            views.push(app.get(&app.token, &format!("/v1/orders/{id}")).await.body);
        }
        let ended = |v: &serde_json::Value| {
            v["state"] == "confirmed"
                || (v["state"] == "expired" && v["refunds"][0]["state"] == "voided")
        };
        views.iter().all(ended).then_some(views)
    })
    .await;
    let mut states: Vec<&str> = views.iter().filter_map(|v| v["state"].as_str()).collect();
    states.sort_unstable();
    assert_eq!(
        states,
        ["confirmed", "expired"],
        "one reclaimed, one voided"
    );
    let voided = if views[0]["state"] == "expired" {
        &first
    } else {
        &second
    };
    let payments = saga.psp_payments(voided).await;
    assert_eq!(payments.len(), 1, "charged once");
    assert_eq!(payments[0]["status"], "canceled", "voided at the PSP");
    assert_eq!(
        (
            payments[0]["amount_captured"].as_i64(),
            payments[0]["refunds"].as_array().map(Vec::len)
        ),
        (Some(0), Some(0)),
        "nothing taken, nothing refunded"
    );
    assert_eq!(
        app.buckets("LAST").await,
        Buckets {
            available: 0,
            reserved: 0,
            sold: 1
        }
    );
    assert_audit_clean(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_landing_around_the_ttl_end_confirmed_or_refunded_and_conserve_units() {
    let saga = Saga::start_with_ttl(
        r#"{"latency_ms": 1000}"#,
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .await;
    let app = saga.app.clone();
    app.add_product("EDGE", 100, 200).await;
    let _expiry = spawn_expiry(&app.database_url, Duration::from_millis(50)).await;
    let ids = place_many(&app, "EDGE", 200).await;
    // Each order's fate must match the PSP's books: an authorization ends
    // confirmed (directly or reactivated) or voided (the order expired); no
    // payment, expired.
    // (Under load some orders lapse before the worker reaches them; those are
    // never charged.)
    let fates = eventually(
        "every order to match the PSP's books",
        Duration::from_secs(90),
        || async {
            let mut fates = std::collections::BTreeMap::<String, usize>::new();
            // The PSP answers every call after its latency: ask about all orders at once.
            let (app, saga) = (&app, &saga);
            let books = futures::future::join_all(ids.iter().map(|id| async move {
                let state = app.get(&app.token, &format!("/v1/orders/{id}")).await.body["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                (state, saga.psp_payments(id).await)
            }))
            .await;
            for (state, payments) in books {
                let status = payments.first().and_then(|p| p["status"].as_str());
                let settled = matches!(
                    (status, state.as_str()),
                    (Some("requires_capture"), "confirmed") | (Some("canceled") | None, "expired")
                );
                if !settled || payments.len() > 1 {
                    return None;
                }
                *fates.entry(state).or_default() += 1;
            }
            Some(fates)
        },
    )
    .await;
    let confirmed = app
        .count("SELECT count(*) FROM orders WHERE state = 'confirmed'")
        .await;
    assert_eq!(
        fates.get("confirmed").copied().unwrap_or(0) as i64,
        confirmed
    );
    let b = app.buckets("EDGE").await;
    assert_eq!(
        (b.sold, b.reserved, b.available + b.sold),
        (confirmed, 0, 200),
        "units conserved: {fates:?}"
    );
    assert_audit_clean(&app).await;
}

#[tokio::test]
async fn a_direct_edit_of_available_is_reported_by_the_audit_with_exit_1() {
    let app = TestApp::spawn().await;
    app.add_product("SHIRT", 100, 200).await;
    app.buy("SHIRT", 2).await;
    let audit = || {
        std::process::Command::new(binary("soldonce"))
            .args(["audit"])
            .env("DATABASE_URL", &app.database_url)
            .output()
            .expect("run soldonce audit")
    };
    let clean = audit();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );
    sqlx::query("UPDATE stock SET available = available + 37 WHERE sku = 'SHIRT'")
        .execute(&app.pool)
        .await
        .expect("edit");
    let dirty = audit();
    let text = String::from_utf8_lossy(&dirty.stdout);
    assert_eq!(dirty.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ledger_drift SHIRT"),
        "names the SKU and the check: {text}"
    );
}

/// The purge forgets idempotency keys, inbox rows and webhook receipts past
/// the retention, and nothing younger: their time columns are BRIN indexes
/// (a summary per range of pages), which must find exactly the old rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_forgets_what_is_past_retention_and_nothing_younger() {
    let app = TestApp::spawn().await;
    app.add_product("KEPT", 100, 100).await;
    for _ in 0..6 {
        assert_eq!(app.buy("KEPT", 1).await.status, 202);
    }
    for statement in [
        "INSERT INTO inbox (consumer, event_id) SELECT 'purge-test', gen_random_uuid() FROM generate_series(1, 6)",
        "INSERT INTO webhook_receipts (webhook_id, event_type) SELECT 'wh_' || i, 'payment.succeeded' FROM generate_series(1, 6) i",
        // Half of each table's rows are two days old.
        "UPDATE idempotency_keys SET created_at = now() - interval '2 days' WHERE ctid IN (SELECT ctid FROM idempotency_keys LIMIT 3)",
        "UPDATE inbox SET processed_at = now() - interval '2 days' WHERE ctid IN (SELECT ctid FROM inbox LIMIT 3)",
        "UPDATE webhook_receipts SET received_at = now() - interval '2 days' WHERE ctid IN (SELECT ctid FROM webhook_receipts LIMIT 3)",
    ] {
        sqlx::query(statement)
            .execute(&app.pool)
            .await
            .expect(statement);
    }
    let purged = store::retention::purge(&app.pool, Duration::from_secs(24 * 3600))
        .await
        .expect("purge");
    assert_eq!(purged, 9, "three old rows of each table");
    for (table, column) in [
        ("idempotency_keys", "created_at"),
        ("inbox", "processed_at"),
        ("webhook_receipts", "received_at"),
    ] {
        let (left, old): (i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*), count(*) FILTER (WHERE {column} < now() - interval '1 day') FROM {table}"
        ))
        .fetch_one(&app.pool)
        .await
        .expect(table);
        assert_eq!(
            (left, old),
            (3, 0),
            "{table}: the young rows stay, no old one"
        );
    }
    // The purge is set-based over the BRIN index once the table is large
    // enough; it is an index on each time column either way.
    let brin = app
        .count(
            "SELECT count(*) FROM pg_indexes WHERE indexname IN ('idempotency_keys_created', 'inbox_processed', 'webhook_receipts_received') AND indexdef LIKE '%USING brin%'",
        )
        .await;
    assert_eq!(brin, 3);
}
