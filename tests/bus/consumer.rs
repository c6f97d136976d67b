//! The consumer runtime: poison is dead-lettered, duplicates have no second
//! effect, and the consumer keeps going.

use anyhow::Context;
use async_nats::jetstream::message::PublishMessage;
use bus::consumer::{Batching, ConsumerSpec, Delivery, HandleError, Handler, Tx};
use localservers::Nats;
use soldonce_tests::{eventually, servers};
use sqlx::PgPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use store::inbox::PgInbox;
use uuid::Uuid;

/// Records each event it handles in `test_effects`.
pub(super) struct RecordEffects;

impl Handler for RecordEffects {
    type Inbox = PgInbox;
    type Prepared = ();
    type Recorded = ();

    async fn prepare(&self, _: &Delivery) -> Result<(), HandleError> {
        Ok(())
    }

    async fn record(
        &self,
        tx: &mut Tx<Self>,
        batch: &[(&Delivery, &())],
    ) -> Result<(), HandleError> {
        insert_effects(tx, batch).await
    }
}

/// One `test_effects` row per event, in batch order.
async fn insert_effects(
    tx: &mut Tx<RecordEffects>,
    batch: &[(&Delivery, &())],
) -> Result<(), HandleError> {
    let ids: Vec<Uuid> = batch.iter().map(|(d, _)| d.event.id).collect();
    sqlx::query("INSERT INTO test_effects (event_id) SELECT * FROM unnest($1::uuid[])")
        .bind(&ids)
        .execute(&mut **tx)
        .await
        .context("recording the effects")?;
    Ok(())
}

pub(super) fn envelope(id: Uuid, event_type: &str) -> Vec<u8> {
    envelope_about(id, &id.to_string(), event_type)
}

/// An event of `subject` (the aggregate it is about, e.g. an order).
fn envelope_about(id: Uuid, subject: &str, event_type: &str) -> Vec<u8> {
    envelope_recorded(id, subject, event_type, chrono::Utc::now())
}

/// An event of `subject` recorded at `time`.
fn envelope_recorded(
    id: Uuid,
    subject: &str,
    event_type: &str,
    time: chrono::DateTime<chrono::Utc>,
) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0", "id": id, "source": "soldonce/test", "type": event_type,
        "subject": subject, "time": time, "datacontenttype": "application/json",
        "correlationid": id, "causationid": id, "data": {}
    }))
    .expect("json")
}

pub(super) async fn publish(js: &async_nats::jetstream::Context, msg_id: &str, payload: Vec<u8>) {
    let msg = PublishMessage::build()
        .payload(payload.into())
        .message_id(msg_id);
    js.send_publish("soldonce.order.placed.test", msg)
        .await
        .expect("publish")
        .await
        .expect("ack");
}

/// A fresh database with `test_effects` (`constraint` added to its one
/// column) and a private NATS with the stream.
async fn setup(constraint: &str) -> (PgPool, Nats, async_nats::jetstream::Context) {
    let (_, pool, nats, js) = setup_at(constraint).await;
    (pool, nats, js)
}

/// [`setup`], with the database's URL.
pub(super) async fn setup_at(
    constraint: &str,
) -> (String, PgPool, Nats, async_nats::jetstream::Context) {
    let url = servers::fresh_database().await;
    let (pool, nats, js) = setup_on(&url, constraint).await;
    (url, pool, nats, js)
}

/// `test_effects` in the migrated database at `url`, and a private NATS
/// with the stream.
async fn setup_on(url: &str, constraint: &str) -> (PgPool, Nats, async_nats::jetstream::Context) {
    let pool = PgPool::connect(url).await.expect("db");
    sqlx::query(&format!(
        "CREATE TABLE test_effects (event_id uuid NOT NULL {constraint})"
    ))
    .execute(&pool)
    .await
    .expect("table");
    let nats = Nats::start_temporary().expect("nats");
    let js = bus::connect(&nats.url()).await.expect("connect");
    bus::ensure_stream(&js, &bus::StreamSettings::default())
        .await
        .expect("stream");
    (pool, nats, js)
}

/// Runs [`RecordEffects`] as `test-consumer`; send `true` to stop it.
pub(super) fn start(
    js: &async_nats::jetstream::Context,
    pool: &PgPool,
    concurrency: usize,
    batch_size: usize,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let batching = batches_of(batch_size, 2);
    start_with(js, pool, concurrency, batching, Arc::new(RecordEffects))
}

/// Runs `handler` as `test-consumer`; send `true` to stop it.
fn start_with<H: Handler<Inbox = PgInbox>>(
    js: &async_nats::jetstream::Context,
    pool: &PgPool,
    concurrency: usize,
    batching: Batching,
    handler: Arc<H>,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let spec = ConsumerSpec {
        name: "test-consumer".into(),
        filter_subjects: vec!["soldonce.order.placed.>".into()],
        types: vec!["soldonce.order.placed.v1".into()],
        ack_wait: Duration::from_secs(5),
        max_deliver: 3,
        backoff: vec![],
        concurrency,
        batching,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = tokio::spawn(bus::consumer::run(
        js.clone(),
        PgInbox::new(pool.clone()),
        spec,
        handler,
        stopped,
    ));
    (stop, runner)
}

/// Batches of at most `batch_size`, recorded by `recorders`, without linger.
fn batches_of(batch_size: usize, recorders: usize) -> Batching {
    Batching {
        batch_size,
        recorders,
        linger: Duration::ZERO,
    }
}

/// The durable consumer `name`'s state on the stream, if it can be read.
async fn consumer_info(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Option<async_nats::jetstream::consumer::Info> {
    let mut c = js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            name,
            bus::STREAM,
        )
        .await
        .ok()?;
    c.info().await.ok().cloned()
}

/// Waits until the durable consumer `name` has nothing pending or in hand.
pub(super) async fn wait_idle(js: &async_nats::jetstream::Context, name: &str) {
    eventually(
        &format!("consumer {name} to be idle"),
        Duration::from_secs(30),
        || async move {
            let info = consumer_info(js, name).await?;
            (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
        },
    )
    .await;
}

pub(super) async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Polls `sql` (a count) until it is `expected`, at most `limit`.
async fn wait_until_count(pool: &PgPool, what: &str, limit: Duration, sql: &str, expected: i64) {
    eventually(what, limit, || async {
        (count(pool, sql).await == expected).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_a_duplicate_has_no_second_effect_and_the_consumer_goes_on() {
    let (pool, _nats, js) = setup("").await;
    let (stop, runner) = start(&js, &pool, 4, 4);

    let (first, last) = (Uuid::now_v7(), Uuid::now_v7());
    publish(&js, "m1", b"{ not json".to_vec()).await;
    publish(
        &js,
        "m2",
        envelope(Uuid::now_v7(), "soldonce.order.placed.v9"),
    )
    .await;
    publish(&js, "m3", envelope(first, "soldonce.order.placed.v1")).await;
    // The same event again under another message id: the stream keeps it, the inbox must not.
    publish(&js, "m4", envelope(first, "soldonce.order.placed.v1")).await;
    publish(&js, "m5", envelope(last, "soldonce.order.placed.v1")).await;

    eventually(
        "the last event to be handled",
        Duration::from_secs(30),
        || async {
            let handled: Option<(i32,)> =
                sqlx::query_as("SELECT 1 FROM test_effects WHERE event_id = $1")
                    .bind(last)
                    .fetch_optional(&pool)
                    .await
                    .expect("query");
            handled.map(|_| ())
        },
    )
    .await;
    wait_until_count(
        &pool,
        "both poison messages to be dead-lettered",
        Duration::from_secs(30),
        "SELECT count(*) FROM dead_letters",
        2,
    )
    .await;
    // Messages are handled concurrently: wait until the consumer has nothing
    // in hand, then count.
    wait_idle(&js, "test-consumer").await;
    let effects: i64 = count(&pool, "SELECT count(*) FROM test_effects").await;
    assert_eq!(
        effects, 2,
        "first and last once each; the duplicate had no effect"
    );
    let reasons: Vec<(String,)> =
        sqlx::query_as("SELECT reason FROM dead_letters ORDER BY stream_seq")
            .fetch_all(&pool)
            .await
            .expect("reasons");
    assert!(reasons[0].0.starts_with("invalid envelope"), "{reasons:?}");
    assert!(reasons[1].0.contains("order.placed.v9"), "{reasons:?}");
    stopped(stop, runner).await;
}

/// A consumer that starts while NATS is away (a service restarted while the
/// broker restarts too) waits for it, as a process waits at its start for
/// the stream, instead of ending: a service without its consumer stops,
/// and where nothing restarts it the orders it should handle wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_starts_while_nats_is_away_waits_for_it_and_then_consumes() {
    let (pool, mut nats, js) = setup("").await;
    nats.kill();
    let (stop, runner) = start(&js, &pool, 4, 4);
    // Longer than a JetStream request's timeout, so the first tries have failed.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        !runner.is_finished(),
        "the consumer ended while NATS was away: {:?}",
        runner.await
    );
    nats.restart().expect("nats back");
    let id = Uuid::now_v7();
    publish(&js, "back", envelope(id, "soldonce.order.placed.v1")).await;
    wait_until_count(
        &pool,
        "the event published once NATS is back to be handled",
        Duration::from_secs(60),
        &format!("SELECT count(*) FROM test_effects WHERE event_id = '{id}'"),
        1,
    )
    .await;
    stopped(stop, runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_fails_inside_a_batch_fails_alone_and_the_rest_commit_together() {
    let bad = Uuid::now_v7();
    // The effect of one event is refused by the database, every time.
    let (pool, _nats, js) = setup(&format!("CHECK (event_id <> '{bad}')")).await;
    // Everything is on the stream before the consumer starts, so it pulls full batches.
    let good: Vec<Uuid> = (0..60).map(|_| Uuid::now_v7()).collect();
    for (i, id) in good.iter().enumerate() {
        publish(
            &js,
            &format!("g{i}"),
            envelope(*id, "soldonce.order.placed.v1"),
        )
        .await;
        if i == 20 {
            publish(&js, "bad", envelope(bad, "soldonce.order.placed.v1")).await;
            publish(&js, "junk", b"{ not json".to_vec()).await;
        }
    }
    let (stop, runner) = start(&js, &pool, 64, 16);
    wait_until_count(
        &pool,
        "the failing event and the junk to be dead-lettered",
        Duration::from_secs(60),
        "SELECT count(*) FROM dead_letters",
        2,
    )
    .await;
    wait_until_count(
        &pool,
        "every good event's effect",
        Duration::from_secs(60),
        "SELECT count(*) FROM test_effects",
        60,
    )
    .await;
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT event_id) FROM test_effects").await,
        60,
        "each good event once"
    );
    let transactions = count(&pool, "SELECT count(DISTINCT xmin::text) FROM test_effects").await;
    assert!(
        transactions < 60,
        "good events were committed in batches: 60 effects in {transactions} transactions"
    );
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM dead_letters WHERE reason LIKE 'max deliveries%'")
            .fetch_one(&pool)
            .await
            .expect("the failing event's dead letter");
    assert!(reason.contains("test_effects"), "{reason}");
    assert_eq!(
        count(
            &pool,
            &format!("SELECT count(*) FROM inbox WHERE event_id = '{bad}'")
        )
        .await,
        0,
        "the failed event left no inbox row"
    );
    stopped(stop, runner).await;
}

/// [`RecordEffects`] that the tests watch: it notes the events of each
/// batch it prepares, holds the preparation of the `slow` event until the
/// gate opens, and keeps the most transactions it was ever recording in at
/// once.
struct WatchedEffects {
    slow: Option<Uuid>,
    gate: tokio::sync::watch::Receiver<bool>,
    batches: std::sync::Mutex<Vec<Vec<Uuid>>>,
    recording: AtomicUsize,
    most: AtomicUsize,
}

impl WatchedEffects {
    fn new(slow: Option<Uuid>, gate: tokio::sync::watch::Receiver<bool>) -> Self {
        WatchedEffects {
            slow,
            gate,
            batches: Default::default(),
            recording: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        }
    }
}

impl WatchedEffects {
    /// One that never holds a message back.
    fn ungated() -> Self {
        WatchedEffects::new(None, tokio::sync::watch::channel(true).1)
    }
}

/// Stops a consumer [`start_with`] started and checks it ran cleanly.
async fn stopped(
    stop: tokio::sync::watch::Sender<bool>,
    runner: tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    stop.send(true).expect("stop");
    runner.await.expect("runner").expect("consumer ran cleanly");
}

impl Handler for WatchedEffects {
    type Inbox = PgInbox;
    type Prepared = ();
    type Recorded = ();

    async fn prepare(&self, d: &Delivery) -> Result<(), HandleError> {
        if self.slow == Some(d.event.id) {
            let mut gate = self.gate.clone();
            gate.wait_for(|open| *open).await.context("the gate")?;
        }
        Ok(())
    }

    fn prepare_all<'a>(
        &'a self,
        _consumer: &'a str,
        batch: &'a [&'a Delivery],
    ) -> impl futures::Stream<Item = (usize, Result<(), HandleError>)> + Send + 'a {
        use futures::FutureExt;
        let ids = batch.iter().map(|d| d.event.id).collect();
        self.batches.lock().expect("batches").push(ids);
        batch
            .iter()
            .enumerate()
            .map(|(i, d)| self.prepare(d).map(move |r| (i, r)))
            .collect::<futures::stream::FuturesUnordered<_>>()
    }

    async fn record(
        &self,
        tx: &mut Tx<Self>,
        batch: &[(&Delivery, &())],
    ) -> Result<(), HandleError> {
        let now = self.recording.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let result = insert_effects(tx, batch).await;
        self.recording.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

async fn recorded(pool: &PgPool, ids: &[Uuid]) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT event_id FROM test_effects WHERE event_id = ANY($1) ORDER BY seq")
        .bind(ids)
        .fetch_all(pool)
        .await
        .expect("effects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_records_what_is_prepared_without_waiting_for_its_slowest_message_and_keeps_an_orders_messages_in_order(
) {
    let (pool, _nats, js) = setup("").await;
    sqlx::query("ALTER TABLE test_effects ADD COLUMN seq bigserial")
        .execute(&pool)
        .await
        .expect("seq");
    // The slow message and a later one about the same order, among 30 others.
    let (slow, follower) = (Uuid::now_v7(), Uuid::now_v7());
    let fast: Vec<Uuid> = (0..30).map(|_| Uuid::now_v7()).collect();
    publish(
        &js,
        "slow",
        envelope_about(slow, "order-a", "soldonce.order.placed.v1"),
    )
    .await;
    for (i, id) in fast.iter().enumerate() {
        publish(
            &js,
            &format!("f{i}"),
            envelope(*id, "soldonce.order.placed.v1"),
        )
        .await;
        if i == 3 {
            publish(
                &js,
                "follower",
                envelope_about(follower, "order-a", "soldonce.order.placed.v1"),
            )
            .await;
        }
    }
    let (open, gate) = tokio::sync::watch::channel(false);
    let handler = Arc::new(WatchedEffects::new(Some(slow), gate));
    // The pull hands over what is on the stream in chunks: a linger lets
    // the first batch gather all of it (with none, a loaded machine's first
    // chunk held only the slow message and four others).
    let batching = Batching {
        linger: Duration::from_millis(500),
        ..batches_of(64, 2)
    };
    let (stop, runner) = start_with(&js, &pool, 64, batching, handler.clone());

    // The slow message is the stream's first: it opens a batch, which holds others.
    let batch = eventually(
        "the slow message's batch",
        Duration::from_secs(30),
        || async {
            handler
                .batches
                .lock()
                .expect("batches")
                .iter()
                .find(|b| b.contains(&slow))
                .cloned()
        },
    )
    .await;
    let others: Vec<Uuid> = fast
        .iter()
        .filter(|id| batch.contains(id))
        .copied()
        .collect();
    assert!(
        !others.is_empty() && batch.contains(&follower),
        "everything was on the stream before the consumer started, so the first batch holds more than its first message: {batch:?}"
    );
    // Its other messages are recorded while it is still being prepared…
    eventually(
        "the slow message's batch-mates to be recorded",
        Duration::from_secs(30),
        || async { (recorded(&pool, &others).await.len() == others.len()).then_some(()) },
    )
    .await;
    // …but not the later message about its order, nor itself.
    assert_eq!(
        recorded(&pool, &[slow, follower]).await,
        Vec::<Uuid>::new(),
        "a message about the same order waits for the earlier one"
    );

    open.send(true).expect("open the gate");
    let mut everything = fast.clone();
    everything.extend([slow, follower]);
    eventually("every effect", Duration::from_secs(30), || async {
        (recorded(&pool, &everything).await.len() == everything.len()).then_some(())
    })
    .await;
    assert_eq!(
        recorded(&pool, &[slow, follower]).await,
        vec![slow, follower],
        "the order's messages were recorded in their order"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox").await,
        32,
        "one inbox row per message, none twice"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM dead_letters").await, 0);
    stopped(stop, runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn however_many_batches_are_in_hand_a_consumer_records_in_no_more_transactions_at_once_than_its_recorders(
) {
    let (pool, _nats, js) = setup("").await;
    let ids: Vec<Uuid> = (0..120).map(|_| Uuid::now_v7()).collect();
    for (i, id) in ids.iter().enumerate() {
        publish(
            &js,
            &format!("m{i}"),
            envelope(*id, "soldonce.order.placed.v1"),
        )
        .await;
    }
    // Batches of 4, up to 30 of them in hand at once, one recorder.
    let handler = Arc::new(WatchedEffects::ungated());
    let (stop, runner) = start_with(&js, &pool, 120, batches_of(4, 1), handler.clone());
    eventually("every effect", Duration::from_secs(60), || async {
        (count(&pool, "SELECT count(*) FROM test_effects").await == 120).then_some(())
    })
    .await;
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT event_id) FROM test_effects").await,
        120,
        "each event once"
    );
    let batches = handler.batches.lock().expect("batches").len();
    assert!(
        batches >= 30,
        "120 messages in batches of at most 4: {batches} batches"
    );
    assert_eq!(
        handler.most.load(Ordering::SeqCst),
        1,
        "one recorder: one transaction at a time, whatever the {batches} batches"
    );
    stopped(stop, runner).await;
}

/// With a linger, a batch that is not full waits after its first message
/// for more: messages published one by one, the later ones only once the
/// first is in hand, are prepared and recorded as one batch; it stops
/// waiting as soon as it is full, and a lone message is handled when the
/// linger ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_batch_gathers_messages_that_arrive_after_its_first_until_it_is_full() {
    let (pool, _nats, js) = setup("UNIQUE").await;
    let handler = Arc::new(WatchedEffects::ungated());
    // Far longer than the test: the batch ends because it is full.
    let batching = Batching {
        batch_size: 5,
        recorders: 1,
        linger: Duration::from_secs(600),
    };
    let (stop, runner) = start_with(&js, &pool, 64, batching, handler.clone());
    let ids: Vec<Uuid> = (0..6).map(|_| Uuid::now_v7()).collect();
    publish(&js, "m0", envelope(ids[0], "soldonce.order.placed.v1")).await;
    eventually(
        "the first message in hand",
        Duration::from_secs(30),
        || async {
            let info = consumer_info(&js, "test-consumer").await?;
            (info.num_pending == 0 && info.num_ack_pending == 1).then_some(())
        },
    )
    .await;
    for (i, id) in ids.iter().enumerate().take(5).skip(1) {
        publish(
            &js,
            &format!("m{i}"),
            envelope(*id, "soldonce.order.placed.v1"),
        )
        .await;
    }
    eventually("the five effects", Duration::from_secs(30), || async {
        (count(&pool, "SELECT count(*) FROM test_effects").await == 5).then_some(())
    })
    .await;
    assert_eq!(
        *handler.batches.lock().expect("batches"),
        vec![ids[..5].to_vec()],
        "the five messages as one batch, in order"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox WHERE consumer = 'test-consumer'"
        )
        .await,
        5,
        "each message's inbox row"
    );
    stopped(stop, runner).await;

    // A batch that never fills is handled once its linger ends.
    let batching = Batching {
        linger: Duration::from_millis(300),
        ..batching
    };
    let (stop, runner) = start_with(&js, &pool, 64, batching, handler.clone());
    publish(&js, "m5", envelope(ids[5], "soldonce.order.placed.v1")).await;
    eventually("the lone effect", Duration::from_secs(30), || async {
        (count(&pool, "SELECT count(*) FROM test_effects").await == 6).then_some(())
    })
    .await;
    assert_eq!(
        handler.batches.lock().expect("batches").last(),
        Some(&vec![ids[5]]),
        "the lone message as a batch of its own"
    );
    stopped(stop, runner).await;
}

/// A first delivery of an event published soon after it was recorded is
/// handled without looking in the inbox first; an event published long
/// after (a repair, a redrive) is looked for, and a copy of one already
/// handled is acked without the handler's work. Either way the effect is
/// recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_event_that_may_be_a_copy_is_looked_for_before_the_handlers_work() {
    let (pool, _nats, js) = setup("UNIQUE").await;
    let handler = Arc::new(WatchedEffects::ungated());
    let (stop, runner) = start_with(&js, &pool, 64, batches_of(1, 1), handler.clone());
    let (fresh, old) = (Uuid::now_v7(), Uuid::now_v7());
    let an_hour_ago = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    let placed = "soldonce.order.placed.v1";
    // Each event twice, under two message ids (so the stream keeps both).
    for (copy, (id, at)) in [(fresh, chrono::Utc::now()), (old, an_hour_ago)]
        .into_iter()
        .enumerate()
    {
        for n in 0..2 {
            let body = envelope_recorded(id, &id.to_string(), placed, at);
            publish(&js, &format!("e{copy}-{n}"), body).await;
            wait_idle(&js, "test-consumer").await;
        }
    }
    let prepared: Vec<Uuid> = handler
        .batches
        .lock()
        .expect("batches")
        .iter()
        .flatten()
        .copied()
        .collect();
    assert_eq!(
        prepared,
        vec![fresh, fresh, old],
        "the fresh event's copy went to the handler (the inbox row stopped it), the old event's copy did not"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM test_effects").await,
        2,
        "one effect per event"
    );
    stopped(stop, runner).await;
}

/// Over a primary with a synchronous standby, a consumer acknowledges an
/// event only once the standby has its effect: its commit waits for the
/// standby, and if that wait is cancelled (PostgreSQL then keeps the commit
/// locally and reports it done) the message is not acknowledged but
/// delivered again, and acknowledged, without a second effect, once the
/// standby is back. Whether commits wait is read by the transaction's own
/// first statement (`replication::waits!`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_the_synchronous_standby_does_not_have_is_never_acknowledged() {
    let dirs = tempfile::tempdir().expect("temp dir");
    let (primary, mut standby) = soldonce_tests::servers::primary_with_standby(dirs.path());
    let url = soldonce_tests::servers::migrated_database_on(&primary).await;
    let (pool, _nats, js) = setup_on(&url, "").await;
    let spec = ConsumerSpec {
        name: "test-consumer".into(),
        filter_subjects: vec!["soldonce.order.placed.>".into()],
        types: vec!["soldonce.order.placed.v1".into()],
        ack_wait: Duration::from_secs(30),
        // Never dead-lettered while the standby is away.
        max_deliver: 100,
        backoff: vec![Duration::from_millis(200)],
        concurrency: 4,
        batching: batches_of(1, 1),
    };
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let runner = tokio::spawn(bus::consumer::run(
        js.clone(),
        PgInbox::new(pool.clone()),
        spec,
        Arc::new(RecordEffects),
        stopping,
    ));
    let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
    let placed = "soldonce.order.placed.v1";
    publish(&js, "first", envelope(first, placed)).await;
    wait_idle(&js, "test-consumer").await;

    // The standby goes away: the consumer's commit of the second waits.
    standby.stop();
    publish(&js, "second", envelope(second, placed)).await;
    let pid = soldonce_tests::servers::commit_waiting_for_standby(
        &pool,
        "the consumer's commit waiting for the standby",
    )
    .await;
    sqlx::query("SELECT pg_cancel_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .expect("cancel the wait");
    // The cancelled wait ends the commit: the primary keeps it and shows it.
    wait_until_count(
        &pool,
        "the cancelled commit shown",
        Duration::from_secs(30),
        "SELECT count(*) FROM test_effects",
        2,
    )
    .await;
    // Not acknowledged: delivered again (and again, while the standby is away).
    eventually(
        "the second event delivered again",
        Duration::from_secs(30),
        || async {
            let info = consumer_info(&js, "test-consumer").await?;
            (info.num_redelivered >= 1).then_some(())
        },
    )
    .await;
    let info = consumer_info(&js, "test-consumer").await.expect("info");
    assert!(
        info.num_pending + info.num_ack_pending as u64 >= 1,
        "the second event is not acknowledged while the standby lacks it: {info:?}"
    );

    // The standby is back: acknowledged, its effect still once.
    standby.restart().expect("standby back");
    wait_idle(&js, "test-consumer").await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM test_effects").await,
        2,
        "each effect once"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox WHERE consumer = 'test-consumer'"
        )
        .await,
        2,
        "one inbox row each"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM dead_letters").await,
        0,
        "nothing dead-lettered"
    );
    stopped(stop, runner).await;
}

/// The look for which events of a batch were handled already runs before
/// every batch. Prepared, PostgreSQL may keep a generic plan made on the
/// statistics of the last `ANALYZE`, and on a new system those say the
/// inbox is nearly empty: the plan kept read every inbox row of the
/// consumer at each call until autovacuum analyzed the table again. So the
/// look's statement runs in a function that plans it at each call, while
/// the call itself is kept prepared (one round trip): on a grown inbox
/// whose statistics are still those of a few rows or none, it reads the
/// asked ids and nothing else (PostgreSQL's counts of what the
/// transaction read).
#[tokio::test]
async fn the_look_for_handled_events_is_planned_on_the_inbox_as_it_is_and_reads_only_the_asked_ids()
{
    // Statistics of an inbox with both consumers' rows, of one taken
    // before the consumer had any (then PostgreSQL counts a handful of rows
    // for it, and a look by consumer with the ids as a filter reads them
    // all), and of an empty one (a new system).
    look_for_handled_events_on_statistics_of(40, 40).await;
    look_for_handled_events_on_statistics_of(0, 40).await;
    look_for_handled_events_on_statistics_of(0, 0).await;
}

/// The look's plan and answers on an inbox grown to 20,000 of the
/// payment-worker's rows while its statistics are still those of `mine` of
/// its rows and `theirs` of fulfillment's.
async fn look_for_handled_events_on_statistics_of(mine: i64, theirs: i64) {
    use events::Inbox;
    let app = soldonce_tests::TestApp::spawn().await;
    // One connection: the inbox's look-ups and the checks below share it.
    let pool = soldonce_tests::one_connection_pool(&app.database_url).await;
    let inbox = PgInbox::new(pool.clone());
    let insert = |consumer: &str, n: i64| {
        format!(
            "INSERT INTO inbox (consumer, event_id) \
             SELECT '{consumer}', gen_random_uuid() FROM generate_series(1, {n})"
        )
    };
    for sql in [
        // No autovacuum during the test: the statistics stay those of the small inbox.
        "ALTER TABLE inbox SET (autovacuum_enabled = false)".to_owned(),
        insert("payment-worker", mine),
        insert("fulfillment", theirs),
        "ANALYZE inbox".to_owned(),
    ] {
        sqlx::query(&sql)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // More calls than PostgreSQL's five custom plans before it may keep a generic one.
    for _ in 0..8 {
        inbox
            .seen("payment-worker", &[Uuid::now_v7()])
            .await
            .expect("seen");
    }
    let prepared: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_prepared_statements WHERE statement = $1")
            .bind(store::inbox::SEEN_SQL)
            .fetch_one(&pool)
            .await
            .expect("prepared statements");
    assert_eq!(
        prepared, 1,
        "the look's call is kept prepared: one round trip"
    );
    sqlx::query(&insert("payment-worker", 20_000))
        .execute(&pool)
        .await
        .expect("a grown inbox");
    let handled: Uuid = sqlx::query_scalar(
        "SELECT event_id FROM inbox WHERE consumer = 'payment-worker' ORDER BY event_id LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .expect("a handled event");
    let fresh = Uuid::now_v7();
    assert_eq!(
        inbox
            .seen("payment-worker", &[fresh, handled])
            .await
            .expect("seen"),
        [false, true],
        "one answer per id, in the order asked"
    );
    // The same prepared call on the grown inbox, with its statistics still
    // those of the small one, in a transaction whose reads PostgreSQL
    // counts.
    let mut tx = soldonce_tests::counted_transaction(&pool).await;
    let seen: Vec<Uuid> = sqlx::query_scalar(store::inbox::SEEN_SQL)
        .bind("payment-worker")
        .bind(vec![fresh, handled])
        .fetch_all(&mut *tx)
        .await
        .expect("the look");
    assert_eq!(seen, [handled]);
    let (scanned, probed): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(seq_tup_read), 0)::bigint FROM pg_stat_xact_user_tables WHERE relname = 'inbox'), \
                (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)::bigint \
                 FROM pg_index WHERE indrelid = 'inbox'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("the transaction's reads");
    tx.rollback().await.expect("rollback");
    assert_eq!(scanned, 0, "no scan of an inbox of 20,000 rows and more");
    assert!(
        probed <= 2,
        "{probed} index entries read for 2 ids, of an inbox of 20,000 rows and more"
    );
}
