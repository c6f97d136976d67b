//! The stream is a copy; PostgreSQL is the truth. A JetStream server that
//! loses power loses what it acknowledged but had not synced: here its
//! store is copied, more orders are placed and published, and the server is
//! killed and started again on the copy. Every accepted order must still be
//! charged and end as it would have, from `events`.

use futures::{stream, StreamExt};
use soldonce_tests::relay::{read_stream, soldonce, stream_len};
use soldonce_tests::saga::{Saga, SagaOptions};
use soldonce_tests::{eventually, TestApp};
use std::sync::Arc;
use std::time::Duration;

/// Places `n` single-unit orders of `LAMP`, 20 at a time; returns their ids.
async fn place(app: &Arc<TestApp>, n: usize) -> Vec<String> {
    stream::iter(0..n)
        .map(|_| {
            let app = app.clone();
            async move {
                let r = app.buy_retrying("LAMP", 1).await;
                assert_eq!(r.status, 202, "{}", r.body);
                r.body["id"].as_str().expect("id").to_owned()
            }
        })
        .buffer_unordered(20)
        .collect()
        .await
}

/// Waits until the outbox is empty and the stream holds as many messages as `events` rows.
async fn wait_published(saga: &Saga) {
    let js = bus::connect(&saga.nats.url()).await.expect("nats");
    eventually(
        "every event to be on the stream",
        Duration::from_secs(60),
        || {
            let js = js.clone();
            async move {
                let outbox = saga.app.count("SELECT count(*) FROM outbox").await;
                let events = saga.app.count("SELECT count(*) FROM events").await;
                (outbox == 0 && stream_len(&js).await == u64::try_from(events).unwrap_or(0))
                    .then_some(())
            }
        },
    )
    .await;
}

/// Places orders, publishes them, snapshots the NATS store, places and
/// publishes more, then rolls NATS back to the snapshot. Returns every
/// order id, and how many events the stream lost.
async fn lose_a_tail(saga: &mut Saga, before: usize, after: usize) -> (Vec<String>, i64) {
    let ids = place(&saga.app, before).await;
    wait_published(saga).await;
    if !saga.workers_running() {
        return lose_the_rest(saga, ids, after).await;
    }
    // The consumers handle the first orders (their durable state is in the
    // store the snapshot copies), then go down before the loss.
    saga.app
        .wait_count(
            "the first orders delivered",
            "SELECT count(*) FROM shipments WHERE state = 'delivered'",
            i64::try_from(before).unwrap_or(0),
        )
        .await;
    saga.wait_quiescent(Duration::from_secs(60)).await;
    saga.stop_workers();
    lose_the_rest(saga, ids, after).await
}

/// [`lose_a_tail`] from the snapshot on.
async fn lose_the_rest(saga: &mut Saga, mut ids: Vec<String>, after: usize) -> (Vec<String>, i64) {
    let snapshot = saga.nats.snapshot_store().expect("snapshot the store");
    ids.extend(place(&saga.app, after).await);
    wait_published(saga).await;
    saga.nats
        .roll_back_to(&snapshot)
        .expect("restart on the older store");
    let js = bus::connect(&saga.nats.url()).await.expect("nats");
    let events = saga.app.count("SELECT count(*) FROM events").await;
    let lost = events - i64::try_from(stream_len(&js).await).unwrap_or(0);
    assert!(
        lost >= i64::try_from(after).unwrap_or(0),
        "the rolled-back stream lacks at least the {after} later order.placed events (lacks {lost})"
    );
    (ids, lost)
}

/// Every order confirmed and delivered, each charged exactly once at the
/// PSP, the stream holding every event exactly once.
async fn assert_all_charged_and_delivered(saga: &Saga, ids: &[String]) {
    let n = i64::try_from(ids.len()).unwrap_or(0);
    saga.app
        .wait_count(
            "every order delivered",
            "SELECT count(*) FROM shipments WHERE state = 'delivered'",
            n,
        )
        .await;
    for id in ids {
        let r = saga
            .app
            .get(&saga.app.token, &format!("/v1/orders/{id}"))
            .await;
        assert_eq!(r.body["state"], "confirmed", "order {id}: {}", r.body);
    }
    assert_eq!(
        saga.app
            .count("SELECT count(*) FROM orders WHERE state = 'expired'")
            .await,
        0,
        "no order expired for a lost event"
    );
    // Every capture recorded too (captures run after shipment, apart from
    // delivery), so psp-sim's books are final.
    saga.wait_quiescent(Duration::from_secs(60)).await;
    // psp-sim's own books: one succeeded payment per order.
    let payments = soldonce_tests::saga::psp_listing(&saga.app, &saga.psp_url, "payments").await;
    let succeeded = payments
        .iter()
        .filter(|p| p["status"] == "succeeded")
        .count();
    assert_eq!(
        succeeded,
        ids.len(),
        "one succeeded payment per order at the PSP"
    );
    assert_eq!(payments.len(), ids.len(), "no second payment for any order");
    let seen = read_stream(&saga.nats.url()).await;
    let events = saga.app.count("SELECT count(*) FROM events").await;
    assert_eq!(
        seen.len(),
        usize::try_from(events).unwrap_or(0),
        "every event on the stream"
    );
    assert!(
        seen.values().all(|(count, _)| *count == 1),
        "no event on the stream twice"
    );
}

/// Checkout, a relay and psp-sim with 1,000 units of `LAMP` reserved for
/// `ttl`; no consumer yet ([`start_consumers`]).
async fn lamp_saga(ttl: Duration) -> Saga {
    let saga = Saga::start_with(SagaOptions {
        worker: false,
        ttl,
        ..SagaOptions::default()
    })
    .await;
    saga.app.add_product("LAMP", 2500, 1_000).await;
    saga
}

async fn start_consumers(saga: &mut Saga) {
    saga.start_worker().await;
    saga.start_fulfillment(Duration::from_millis(5)).await;
    saga.start_expiry(Duration::from_millis(200)).await;
}

/// The consumers handle the first orders, then they and the relay are down
/// through the power loss (the consumers' durable state rolls back with
/// the store): the audit names the gap (how many, and from which position),
/// a relay started afterwards repairs the stream, every order is charged
/// once and delivered, and `replay` and `audit` then pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_rolled_back_by_a_power_loss_is_repaired_from_the_database() {
    let mut saga = lamp_saga(Duration::from_secs(60)).await;
    start_consumers(&mut saga).await;
    let (ids, lost) = lose_a_tail(&mut saga, 30, 40).await;
    saga.stop_relay();

    let (database_url, nats_url) = (saga.app.database_url.clone(), saga.nats.url());
    let env = [
        ("DATABASE_URL", database_url.as_str()),
        ("NATS_URL", nats_url.as_str()),
    ];
    // Counted apart from the audit: the events whose ids the stream's messages do not carry.
    let present: Vec<uuid::Uuid> = read_stream(&saga.nats.url()).await.into_keys().collect();
    let (missing, first_lost): (i64, i64) =
        sqlx::query_as("SELECT count(*), min(position) FROM events WHERE NOT (event_id = ANY($1))")
            .bind(&present)
            .fetch_one(&saga.app.pool)
            .await
            .expect("the events the stream lacks");
    assert_eq!(missing, lost);
    let (code, text) = soldonce(&["audit"], &env);
    assert_eq!(code, Some(1), "the audit fails on a stream gap: {text}");
    assert!(
        text.contains(&format!(
            "VIOLATION stream_gap SOLDONCE: the stream lacks {lost} of the events"
        )),
        "the audit names how many events the stream lacks: {text}"
    );
    assert!(
        text.contains(&format!("the first at position {first_lost}")),
        "the audit names the first missing position {first_lost}: {text}"
    );
    let (code, text) = soldonce(&["stream", "check"], &env);
    assert_eq!(code, Some(1), "{text}");

    saga.start_relay().await;
    start_consumers(&mut saga).await;
    assert_all_charged_and_delivered(&saga, &ids).await;

    let (code, text) = soldonce(&["stream", "check"], &env);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = soldonce(&["audit"], &env);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = soldonce(&["replay"], &env);
    assert_eq!(code, Some(0), "{text}");
}

/// A relay that keeps running through the power loss sees JetStream give
/// new messages sequences it had already acknowledged, and repairs the
/// stream by itself while orders keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_notices_a_rolled_back_stream_and_repairs_it() {
    let mut saga = lamp_saga(Duration::from_secs(60)).await;
    let (mut ids, _) = lose_a_tail(&mut saga, 20, 30).await;
    ids.extend(place(&saga.app, 10).await);
    start_consumers(&mut saga).await;
    assert_all_charged_and_delivered(&saga, &ids).await;
}

/// `soldonce stream repair` republishes, in order and once, every event a
/// stream lost, whatever the relay's window; a second run finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_repair_by_hand_republishes_each_lost_event_once() {
    let mut saga = lamp_saga(SagaOptions::default().ttl).await;
    let (_, lost) = lose_a_tail(&mut saga, 5, 25).await;
    saga.stop_relay();
    let (database_url, nats_url) = (saga.app.database_url.clone(), saga.nats.url());
    let env = [
        ("DATABASE_URL", database_url.as_str()),
        ("NATS_URL", nats_url.as_str()),
    ];
    let (code, text) = soldonce(&["stream", "repair", "--since", "yesterday"], &env);
    assert_eq!(code, Some(2), "a bad --since is a usage error: {text}");
    assert!(text.contains("--since"), "{text}");
    let (code, text) = soldonce(&["--json", "stream", "repair"], &env);
    assert_eq!(code, Some(0), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(text.lines().next().unwrap_or("")).expect("json");
    assert_eq!(report["missing"], lost, "{text}");
    assert_eq!(report["republished"], lost, "{text}");
    let seen = read_stream(&saga.nats.url()).await;
    let events = saga.app.count("SELECT count(*) FROM events").await;
    assert_eq!(seen.len(), usize::try_from(events).unwrap_or(0));
    assert!(seen.values().all(|(count, _)| *count == 1));
    let (code, text) = soldonce(&["--json", "stream", "repair"], &env);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("\"missing\":0"), "{text}");
}
