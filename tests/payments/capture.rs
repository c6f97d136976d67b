//! Authorize at checkout, capture when the order ships (`CAPTURE_AT=shipment`,
//! the default); a payment that cannot settle its order before then is
//! voided, never refunded; 3-D Secure waits for the buyer. Counted in
//! psp-sim's books and in soldonce's own rows.

use soldonce_tests::app::Buckets;
use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, Saga, SagaOptions};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

/// The one payment psp-sim holds for an order, once it reads `status`.
async fn psp_payment_in(saga: &Saga, order_id: &str, status: &str) -> serde_json::Value {
    eventually(
        &format!("order {order_id}'s payment to be {status} at the PSP"),
        SETTLE,
        || async {
            let payments = saga.psp_payments(order_id).await;
            match &payments[..] {
                [p] if p["status"] == status => Some(p.clone()),
                _ => None,
            }
        },
    )
    .await
}

/// Waits until `n` payments are captured, each whole (2500).
async fn captures_recorded(saga: &Saga, what: &str, n: i64) {
    saga.app
        .wait_count(
            what,
            "SELECT count(*) FROM payments WHERE capture_state = 'captured' AND captured_minor = 2500",
            n,
        )
        .await;
}

/// The order as checkout shows it.
async fn view(saga: &Saga, order_id: &str) -> serde_json::Value {
    saga.app
        .get(&saga.app.token, &format!("/v1/orders/{order_id}"))
        .await
        .body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorized_order_is_captured_once_when_it_ships_and_not_before() {
    let mut saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 10).await;
    let mut ids = vec![];
    for _ in 0..4 {
        ids.push(saga.order("MUG").await);
    }
    for id in &ids {
        assert_eq!(saga.settled_state(id, SETTLE).await, "confirmed");
    }
    // Confirmed on an authorization: units sold, nothing taken yet.
    for id in &ids {
        let held = psp_payment_in(&saga, id, "requires_capture").await;
        assert_eq!(held["amount_captured"], 0, "{held}");
        assert_eq!(held["capture_method"], "manual", "{held}");
        assert_eq!(view(&saga, id).await["payment"]["state"], "authorized");
    }
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 6,
            reserved: 0,
            sold: 4
        }
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM orders WHERE capture = 'authorized'")
            .await,
        4
    );
    // The warehouse ships: each payment is captured, whole, exactly once.
    saga.start_fulfillment(Duration::from_millis(50)).await;
    for id in &ids {
        let taken = psp_payment_in(&saga, id, "succeeded").await;
        assert_eq!(taken["amount_captured"], 2500, "{taken}");
        assert_eq!(taken["amount_minor"], 2500, "{taken}");
    }
    saga.wait_quiescent(SETTLE).await;
    captures_recorded(&saga, "every capture recorded", 4).await;
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.capture_decided.v1'")
            .await,
        4,
        "one capture decided per order"
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.captured.v1'")
            .await,
        4,
        "one capture recorded per order"
    );
    for id in &ids {
        let order = view(&saga, id).await;
        assert_eq!(order["payment"]["state"], "succeeded", "{order}");
        assert_eq!(order["shipment"]["state"], "delivered", "{order}");
        assert_eq!(
            saga.psp_payments(id).await.len(),
            1,
            "one payment per order"
        );
    }
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM payments WHERE refund_state IS NOT NULL")
            .await,
        0,
        "nothing voided or refunded"
    );
    // The PSP's confirmations replayed (a worker whose lease ran out asking
    // again): the round's record finds nothing pending and writes nothing.
    let captured: Vec<String> = sqlx::query_scalar(
        "SELECT payment_id FROM payments WHERE capture_state = 'captured' ORDER BY payment_id",
    )
    .fetch_all(&saga.app.pool)
    .await
    .expect("captured payments");
    assert_eq!(captured.len(), 4);
    let again: Vec<store::captures::Captured> = captured
        .iter()
        .map(|id| store::captures::Captured {
            payment_id: id.clone(),
            captured_minor: 2500,
        })
        .collect();
    let recorded = store::captures::complete_many(&saga.app.pool, &again, "test")
        .await
        .expect("recording the captures again");
    assert!(recorded.is_empty(), "recorded again: {recorded:?}");
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.captured.v1'")
            .await,
        4,
        "still one capture recorded per order"
    );
    assert_audit_clean(&saga.app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_at_confirmation_takes_the_money_at_once() {
    let saga = Saga::start_with(SagaOptions {
        capture_at: payments::psp::CaptureAt::Confirmation,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
    let taken = psp_payment_in(&saga, &id, "succeeded").await;
    assert_eq!(taken["capture_method"], "automatic", "{taken}");
    assert_eq!(taken["amount_captured"], 2500, "{taken}");
    assert_eq!(view(&saga, &id).await["payment"]["state"], "succeeded");
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM orders WHERE capture IS NOT NULL")
            .await,
        0,
        "nothing left to capture"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_landing_after_a_cancel_is_voided_not_refunded() {
    // The charge is still processing when the buyer cancels; it then
    // authorizes. (No `webhook_reorder`: psp-sim reorders webhooks sent
    // within 100 ms of each other, and this one order's never are.)
    let saga = Saga::start(
        r#"{"processing_rate": 1.0, "processing_ms": 1500, "webhook_duplicates": 2}"#,
        Duration::from_secs(2),
    )
    .await;
    saga.app.add_product("MUG", 2500, 5).await;
    let id = saga.order("MUG").await;
    psp_payment_in(&saga, &id, "processing").await;
    let cancel = saga
        .app
        .post_empty(&saga.app.token, &format!("/v1/orders/{id}/cancel"))
        .await;
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    let voided = psp_payment_in(&saga, &id, "canceled").await;
    assert_eq!(voided["cancellation_reason"], "requested", "{voided}");
    assert_eq!(voided["amount_captured"], 0, "{voided}");
    assert_eq!(
        voided["refunds"].as_array().map(Vec::len),
        Some(0),
        "{voided}"
    );
    let order = eventually("the void to be recorded", SETTLE, || async {
        let order = view(&saga, &id).await;
        (order["refunds"][0]["state"] == "voided").then_some(order)
    })
    .await;
    assert_eq!(
        order["state"], "cancelled",
        "a void took nothing back: {order}"
    );
    assert_eq!(order["refunds"][0]["reason"], "cancelled", "{order}");
    assert_eq!(saga.faults_injected("processing").await, 1.0);
    saga.fault_fired("duplicate_webhook", 1.0).await;
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM payments WHERE refund_method = 'void' AND refund_state = 'succeeded'")
            .await,
        1
    );
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 5,
            reserved: 0,
            sold: 0
        }
    );
    assert_audit_clean(&saga.app).await;
}

/// Acts as the buyer at psp-sim's 3-D Secure page.
async fn buyer_acts(saga: &Saga, payment: &serde_json::Value, outcome: &str) {
    let url = payment["next_action"]["url"]
        .as_str()
        .expect("a payment awaiting action names its URL");
    let r = saga
        .app
        .send(
            saga.app
                .client
                .post(url)
                .json(&serde_json::json!({ "outcome": outcome })),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_d_secure_completed_confirms_and_abandoned_ends_the_order_with_nothing_taken() {
    // Reservations of 2 s: only the action's extension (10 minutes) keeps them.
    let mut saga = Saga::start_with(SagaOptions {
        faults:
            r#"{"action_required_rate": 1.0, "webhook_duplicates": 3, "webhook_reorder": true}"#
                .into(),
        ttl: Duration::from_secs(2),
        ..SagaOptions::default()
    })
    .await;
    saga.start_expiry(Duration::from_millis(50)).await;
    saga.app.add_product("MUG", 2500, 5).await;
    let (done, abandoned) = (saga.order("MUG").await, saga.order("MUG").await);
    let waiting = psp_payment_in(&saga, &done, "requires_action").await;
    let left = psp_payment_in(&saga, &abandoned, "requires_action").await;
    // The orders wait for the buyer, holding their units, shown where to go,
    // their reservations extended once (well past their 2 s).
    for (id, payment) in [(&done, &waiting), (&abandoned, &left)] {
        let order = eventually("the order to show the buyer's action", SETTLE, || async {
            let order = view(&saga, id).await;
            (order["payment"]["state"] == "requires_action").then_some(order)
        })
        .await;
        assert_eq!(order["state"], "payment_pending", "{order}");
        assert_eq!(
            order["payment"]["next_action"]["url"],
            payment["next_action"]["url"]
        );
        let at = |field: &str| {
            chrono::DateTime::parse_from_rfc3339(order[field].as_str().expect(field)).expect("time")
        };
        assert!(
            at("expires_at") - at("created_at") > chrono::Duration::minutes(9),
            "extended: {order}"
        );
    }
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.action_required.v1'")
            .await,
        2,
        "once per order, however often the PSP said so"
    );
    buyer_acts(&saga, &waiting, "succeeded").await;
    buyer_acts(&saga, &left, "abandoned").await;
    assert_eq!(saga.settled_state(&done, SETTLE).await, "confirmed");
    assert_eq!(
        saga.settled_state(&abandoned, SETTLE).await,
        "expired",
        "an abandoned challenge ends like any unpaid order"
    );
    let gone = psp_payment_in(&saga, &abandoned, "canceled").await;
    assert_eq!(gone["cancellation_reason"], "abandoned", "{gone}");
    assert_eq!(gone["amount_captured"], 0, "{gone}");
    saga.start_fulfillment(Duration::from_millis(50)).await;
    let taken = psp_payment_in(&saga, &done, "succeeded").await;
    assert_eq!(taken["amount_captured"], 2500, "{taken}");
    saga.wait_quiescent(SETTLE).await;
    assert_eq!(
        saga.app.buckets("MUG").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.confirmed.v1'")
            .await,
        1,
        "duplicated, reordered webhooks confirmed once"
    );
    assert_eq!(saga.faults_injected("action_required").await, 2.0);
    saga.fault_fired("duplicate_webhook", 1.0).await;
    saga.fault_fired("reorder_webhooks", 1.0).await;
    assert_audit_clean(&saga.app).await;
}

/// The warehouse's step decides each capture as its shipment ships (not a
/// sweep over every authorized order): the step names the orders whose
/// shipments shipped, and deciding for them decides exactly those, once,
/// counted by what the calls return and by the events and payment rows;
/// the sweep then finds nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_that_ships_an_order_names_it_and_its_capture_is_decided_once_without_the_sweep() {
    let saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 10).await;
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let id = saga.order("MUG").await;
        assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
        ids.insert(id.parse::<uuid::Uuid>().expect("uuid"));
    }
    for id in &ids {
        let meta = events::Metadata::from_request("test", *id, None);
        let mut tx = saga.app.pool.begin().await.expect("tx");
        store::shipments::create_many(&mut tx, &[(*id, meta)])
            .await
            .expect("ship");
        tx.commit().await.expect("commit");
    }
    // pending → picked → shipped → delivered: only the second step ships them.
    let pool = &saga.app.pool;
    let ids: Vec<uuid::Uuid> = ids.into_iter().collect();
    let picked = step_each(pool, &ids).await;
    let shipped = step_each(pool, &ids).await;
    assert!(picked.shipped.is_empty(), "{picked:?}");
    let named: std::collections::BTreeSet<uuid::Uuid> = shipped.shipped.iter().copied().collect();
    let wanted: std::collections::BTreeSet<uuid::Uuid> = ids.iter().copied().collect();
    assert_eq!(named, wanted, "the step names the orders it shipped");
    assert_eq!(shipped.shipped.len(), 3, "each named once: {shipped:?}");
    let decided = store::captures::decide_for(pool, &shipped.shipped, "test")
        .await
        .expect("decide");
    assert_eq!(decided, 3);
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM payments WHERE capture_state IS NOT NULL")
            .await,
        3,
        "each payment's capture is due"
    );
    let delivered = step_each(pool, &ids).await;
    assert_eq!(delivered.shipped.len(), 0, "{delivered:?}");
    let again = store::captures::decide_for(pool, &shipped.shipped, "test")
        .await
        .expect("decide again");
    let swept = store::captures::decide_shipped(pool, 500, "test")
        .await
        .expect("sweep");
    assert_eq!(
        (again, swept),
        (0, 0),
        "nothing decided twice, nothing left for the sweep"
    );
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.capture_decided.v1'")
            .await,
        3,
        "one capture decided per order"
    );
}

/// One more warehouse step for each of these `ids`' shipments, the orders
/// shipped gathered: their last steps are set an hour back and a step takes
/// those older than half an hour, so a shipment stepped is not due again; a
/// step skips a shipment another writer holds (a late webhook recording its
/// order's payment), and a later one takes it.
async fn step_each(pool: &sqlx::PgPool, ids: &[uuid::Uuid]) -> store::shipments::Advanced {
    let n = ids.len() as u64;
    sqlx::query(
        "UPDATE shipments SET updated_at = updated_at - interval '1 hour' WHERE order_id = ANY($1)",
    )
    .bind(ids)
    .execute(pool)
    .await
    .expect("backdate");
    let all = std::cell::RefCell::new(store::shipments::Advanced::default());
    eventually("a warehouse step for each shipment", SETTLE, || async {
        let step = store::shipments::advance_due(pool, Duration::from_secs(1800), 10, "test")
            .await
            .expect("a warehouse step");
        let mut all = all.borrow_mut();
        all.steps += step.steps;
        all.shipped.extend(step.shipped);
        assert!(all.steps <= n, "more steps than shipments: {all:?}");
        (all.steps == n).then_some(())
    })
    .await;
    all.into_inner()
}

/// Ships these orders by hand (create, then warehouse steps until each has
/// shipped) and decides their captures, as fulfillment's step does; a
/// shipment already further on moves on too.
async fn ship_and_decide(saga: &Saga, ids: &[uuid::Uuid]) {
    let pool = &saga.app.pool;
    let mut tx = pool.begin().await.expect("tx");
    let made: Vec<(uuid::Uuid, events::Metadata)> = ids
        .iter()
        .map(|id| (*id, events::Metadata::from_request("test", *id, None)))
        .collect();
    store::shipments::create_many(&mut tx, &made)
        .await
        .expect("ship");
    tx.commit().await.expect("commit");
    // Steps until each has shipped: a step skips a shipment another
    // writer holds (a late webhook recording its order's payment).
    let mut wanted = ids.to_vec();
    wanted.sort();
    let shipped = eventually(
        "the warehouse's steps to ship these orders",
        SETTLE,
        || async {
            store::shipments::advance_due(pool, Duration::ZERO, 10, "test")
                .await
                .expect("a warehouse step");
            let shipped: Vec<uuid::Uuid> = sqlx::query_scalar(
                "SELECT order_id FROM shipments WHERE order_id = ANY($1) AND state IN ('shipped', 'delivered') ORDER BY order_id",
            )
            .bind(ids)
            .fetch_all(pool)
            .await
            .expect("shipments");
            (shipped == wanted).then_some(shipped)
        },
    )
    .await;
    assert_eq!(shipped, wanted, "the steps shipped these orders");
    let decided = store::captures::decide_for(pool, ids, "test")
        .await
        .expect("decide");
    assert_eq!(decided, ids.len());
}

/// A capture the PSP sits on holds back no other: while psp-sim holds one
/// capture request (far longer than the test), the captures decided after
/// it are asked, confirmed and recorded. Counted in soldonce's payment rows
/// and events and in psp-sim's books; the held one is still owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_the_psp_sits_on_holds_back_no_other() {
    let saga = Saga::start_with(SagaOptions {
        // Long enough that the held call is still in flight at the end.
        psp_timeout: Duration::from_secs(300),
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("MUG", 2500, 10).await;
    let mut ids = vec![];
    for _ in 0..4 {
        let id = saga.order("MUG").await;
        assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
        ids.push(id.parse::<uuid::Uuid>().expect("uuid"));
    }
    // The first capture reaches a PSP that holds every request for 10 minutes.
    saga.set_faults(r#"{"latency_ms": 600000}"#).await;
    ship_and_decide(&saga, &ids[..1]).await;
    saga.fault_fired("latency", 1.0).await;
    saga.set_faults("{}").await;
    // The others ship and are decided while it is held.
    ship_and_decide(&saga, &ids[1..]).await;
    for id in &ids[1..] {
        let taken = psp_payment_in(&saga, &id.to_string(), "succeeded").await;
        assert_eq!(taken["amount_captured"], 2500, "{taken}");
    }
    captures_recorded(&saga, "the three captures recorded", 3).await;
    let held = saga.psp_payments(&ids[0].to_string()).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["status"], "requires_capture", "{held:?}");
    let owed: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "SELECT order_id, capture_state FROM payments WHERE capture_state <> 'captured'",
    )
    .fetch_all(&saga.app.pool)
    .await
    .expect("payments");
    assert_eq!(owed, vec![(ids[0], "pending".to_string())]);
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM events WHERE type = 'order.captured.v1'")
            .await,
        3,
        "one capture recorded per order the PSP answered for"
    );
    assert_eq!(
        saga.faults_injected("latency").await,
        1.0,
        "only the first capture was held"
    );
    // The held capture is leased to the worker waiting on the PSP: a claim
    // now finds nothing due.
    let claimed = store::captures::claim_due(&saga.app.pool, 100, Duration::from_secs(30))
        .await
        .expect("a claim");
    assert!(claimed.is_empty(), "claimed while leased: {claimed:?}");
}

/// A capture's claim and its recording update rows in place (HOT updates):
/// the payment worker's claim writes no entry in any index of `payments`,
/// and the capture's recording none in any index of `orders`; deciding the
/// capture (the order leaves the authorized ones, the payment joins the
/// captures due) and recording it on the payment (it leaves them) do.
/// Counted two ways: the entries in each index, and PostgreSQL's counts of
/// HOT updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captures_claim_and_its_recording_write_no_index_entries() {
    const N: i64 = 4;
    let saga = Saga::start_with(SagaOptions::default()).await;
    saga.app.add_product("MUG", 2500, 10).await;
    let mut ids = vec![];
    for _ in 0..N {
        let id = saga.order("MUG").await;
        assert_eq!(saga.settled_state(&id, SETTLE).await, "confirmed");
        ids.push(id.parse::<uuid::Uuid>().expect("uuid"));
    }
    let pool = &saga.app.pool;
    let orders = [
        "orders_pkey",
        "orders_account",
        "orders_pending_expiry",
        "orders_account_pending",
        "orders_authorized",
    ];
    let payments = ["payments_pkey", "payments_order", "payments_capture_due"];
    let before = (
        soldonce_tests::index_entries(pool, &orders).await,
        soldonce_tests::index_entries(pool, &payments).await,
    );
    ship_and_decide(&saga, &ids).await;
    captures_recorded(&saga, "every capture recorded", N).await;
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM payments WHERE capture_attempts = 1")
            .await,
        N,
        "each capture claimed once"
    );
    let after = (
        soldonce_tests::index_entries(pool, &orders).await,
        soldonce_tests::index_entries(pool, &payments).await,
    );
    let written = |before: &[i64], after: &[i64]| -> Vec<i64> {
        after.iter().zip(before).map(|(a, b)| a - b).collect()
    };
    assert_eq!(
        written(&before.0, &after.0),
        [N, N, 0, 0, 0],
        "orders: the decision wrote one entry in each index the order stays in, the recording none"
    );
    assert_eq!(
        written(&before.1, &after.1),
        [2 * N, 2 * N, N],
        "payments: the decision and the recording one entry each in every index the payment is in, the claim none"
    );
    // Each backend reports its counts within a second or so of its work.
    let hot = eventually("the HOT updates counted", SETTLE, || async {
        let hot: Vec<i64> = sqlx::query_scalar(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname IN ('orders', 'payments') ORDER BY relname",
        )
        .fetch_all(pool)
        .await
        .expect("counts");
        hot.iter().all(|h| *h >= N).then_some(hot)
    })
    .await;
    assert_eq!(
        hot,
        [N, N],
        "one HOT update per order (the recording) and per payment (the claim), no other"
    );
}
