//! The consumer runtime: a durable pull consumer with explicit acks,
//! bounded redelivery with backoff, inbox dedupe `(consumer, event id)` in
//! the same transaction as the handler's effect, and dead letters (a record
//! plus a metric) for what can never be handled — an invalid envelope, an
//! unknown type or version, or a message out of deliveries.
//!
//! Messages are taken in batches: whatever the pull has buffered, up to
//! `batch_size`. A handler [`Handler::prepare_all`]s the messages of a
//! batch at once (its calls out, e.g. to the PSP, concurrent), and each
//! message goes on to be recorded as soon as it is prepared. The messages
//! prepared by every batch in hand meet at the consumer's recorders
//! (`recorders` of them, each one transaction at a time): a recorder takes
//! everything waiting, up to `batch_size`, and [`Handler::record`]s it in
//! one transaction with its inbox rows. So a message waits for its own
//! preparation and at most the transaction before it, never for the
//! slowest call of its batch, and however many batches are in hand, the
//! consumer has at most `recorders` transactions open: under load they grow
//! instead of multiplying (a hot SKU's row is moved once per transaction).
//! A message is never recorded ahead of an earlier message of its batch
//! about the same subject (its order): it waits until that one is
//! committed. Acks follow the commit. If a transaction fails, each of its
//! messages is recorded again on its own, so a message that fails alone is
//! retried (or dead-lettered) alone and never poisons the others. Where the
//! inbox and the dead letters are kept is the [`Inbox`]'s business, never
//! this module's. Two stages of the saga's latency budget are measured
//! here, per consumer: `soldonce_consumer_wait_seconds` (the stream's
//! PubAck to the handler's start, first deliveries only) and
//! `soldonce_consumer_handle_seconds` (a message's batch start to its
//! commit), of which `soldonce_consumer_transaction_seconds` is the
//! recorder's transaction (begin to commit); a transaction's size is
//! `soldonce_consumer_transaction_size`.

use async_nats::jetstream::{self, consumer::pull, AckKind};
use events::{CloudEvent, DeadLetter, Inbox};
use futures::stream::{FuturesUnordered, Stream};
use futures::{FutureExt, StreamExt};
use platform::otel::{Hop, Kind};
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::Instrument;
use uuid::Uuid;

/// How a consumer is set up on the stream.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// The durable name, also the consumer its inbox rows are kept under.
    pub name: String,
    /// Subjects it reads, e.g. `events::names::subjects_of("order.placed.v1")`.
    pub filter_subjects: Vec<String>,
    /// CloudEvents types (with version) it understands; others are dead-lettered.
    pub types: Vec<String>,
    /// How long a delivery may go unacknowledged before JetStream redelivers
    /// it; the runtime extends it with progress acks while a handler runs.
    pub ack_wait: Duration,
    /// Deliveries before a message is dead-lettered.
    pub max_deliver: i64,
    /// Delays before retrying after a transient failure (the n-th entry after
    /// the n-th failure; the last repeats), sent as `Nak(delay)`.
    pub backoff: Vec<Duration>,
    /// Messages in hand at once in this process.
    pub concurrency: usize,
    /// The most messages taken in one batch and recorded in one
    /// transaction (1: one per message).
    pub batch_size: usize,
    /// Transactions recording at once in this process (see the module's
    /// documentation).
    pub recorders: usize,
}

/// `CONSUMER_BATCH_SIZE`, default 32 (1–1000): the most messages a
/// consumer takes at once and records in one transaction.
pub fn batch_size_setting() -> Result<usize, platform::config::ConfigError> {
    let setting = platform::config::var(
        "CONSUMER_BATCH_SIZE",
        "the most messages a consumer takes at once and records in one transaction (1–1000); 1 handles each alone",
    );
    count_setting(setting, 32, 1000)
}

/// `CONSUMER_RECORDERS`, default 4 (1–64): the transactions a consumer
/// process records in at once, each taking every prepared message waiting.
pub fn recorders_setting() -> Result<usize, platform::config::ConfigError> {
    let setting = platform::config::var(
        "CONSUMER_RECORDERS",
        "transactions recording at once in one consumer process (1–64), each taking every prepared message waiting",
    );
    count_setting(setting, 4, 64)
}

/// A count between 1 and `most`, or `default` when unset.
fn count_setting(
    setting: platform::config::Var,
    default: usize,
    most: usize,
) -> Result<usize, platform::config::ConfigError> {
    let n = setting.parsed(default)?;
    if !(1..=most).contains(&n) {
        return Err(platform::config::ConfigError::new(
            setting.name(),
            format!("must be between 1 and {most}"),
        ));
    }
    Ok(n)
}

/// Why a handler failed.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    /// Worth retrying later (database or network trouble). Any error with
    /// context converts to it: `tx.commit().await.context("committing")?`.
    #[error("transient: {0:#}")]
    Transient(#[from] anyhow::Error),
    /// Will never succeed: dead-letter it.
    #[error("permanent: {0}")]
    Permanent(String),
}

/// One delivery, handed to a handler.
pub struct Delivery {
    pub event: CloudEvent,
    /// How many times this message has been delivered (1 the first time).
    pub delivered: i64,
    /// The consumer span's `traceparent` (what the handler's writes continue).
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that travelled with it, validated.
    pub tracestate: Option<String>,
}

impl Delivery {
    /// The W3C trace id the event carries (the one its order was placed
    /// under), for log lines: empty when it carries none.
    pub fn trace_id(&self) -> String {
        self.traceparent
            .as_deref()
            .and_then(platform::trace::TraceParent::parse)
            .map(|t| t.trace_id())
            .unwrap_or_default()
    }
}

/// The transaction a handler records in.
pub type Tx<H> = <<H as Handler>::Inbox as Inbox>::Tx;

/// What a consuming service implements.
pub trait Handler: Send + Sync + 'static {
    /// Where this handler's effects and their inbox rows are kept.
    type Inbox: Inbox;
    /// What one delivery's effect needs, worked out before the batch's
    /// transaction (reads, calls out). No effect may be written then.
    type Prepared: Send + Sync + 'static;
    /// What recording found, for [`Handler::committed`] (metrics, logs).
    type Recorded: Send + 'static;

    /// Prepares one delivery; the deliveries of a batch are prepared at once.
    fn prepare(
        &self,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<Self::Prepared, HandleError>> + Send;

    /// Prepares the deliveries of a batch at once, yielding each one's
    /// result with its index in `batch` as soon as it is ready (the runtime
    /// records what is ready while the rest is still being prepared), each
    /// under its message's log span ([`message_span`]). By default each is
    /// [`Handler::prepare`]d on its own; a handler that reads the same kind
    /// of row for every message overrides it to read the batch's rows in one
    /// query. Every index must be yielded once.
    fn prepare_all<'a>(
        &'a self,
        consumer: &'a str,
        batch: &'a [&'a Delivery],
    ) -> impl Stream<Item = (usize, Result<Self::Prepared, HandleError>)> + Send + 'a {
        batch
            .iter()
            .enumerate()
            .map(|(i, d)| {
                self.prepare(d)
                    .map(move |r| (i, r))
                    .instrument(message_span(consumer, d))
            })
            .collect::<FuturesUnordered<_>>()
    }

    /// Records the effects of fresh deliveries (each never recorded before)
    /// in `tx`, where their inbox rows are already written; the runtime
    /// commits. Handlers never trust message order: they check the current
    /// state.
    fn record(
        &self,
        tx: &mut Tx<Self>,
        batch: &[(&Delivery, &Self::Prepared)],
    ) -> impl Future<Output = Result<Self::Recorded, HandleError>> + Send;

    /// Called once what [`Handler::record`] found is committed.
    fn committed(&self, _recorded: Self::Recorded) {}
}

/// Creates (or updates) the durable consumer on the stream. Beside its own
/// subjects it reads `soldonce.redrive.<name>.>`: the messages it once
/// dead-lettered, sent again by `soldonce dead-letters redrive` to it alone
/// ([`crate::redrive`]).
pub async fn ensure_consumer(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
) -> anyhow::Result<jetstream::consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(crate::STREAM).await?;
    let mut filter_subjects = spec.filter_subjects.clone();
    if events::names::is_token(&spec.name) {
        filter_subjects.push(events::names::redrive_subjects(&spec.name));
    }
    let config = pull::Config {
        durable_name: Some(spec.name.clone()),
        filter_subjects,
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: spec.max_deliver,
        max_ack_pending: i64::try_from(spec.concurrency * 4).unwrap_or(1000),
        ..Default::default()
    };
    Ok(stream.create_consumer(config).await?)
}

/// Consumes until `stop` turns true; the messages in hand are finished first.
pub async fn run<H: Handler>(
    js: jetstream::Context,
    inbox: H::Inbox,
    spec: ConsumerSpec,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let consumer = ensure_consumer(&js, &spec).await?;
    let lag = tokio::spawn(report_lag(consumer.clone(), spec.name.clone()));
    let _lag = AbortOnDrop(lag);
    let spec = Arc::new(spec);
    let inbox = Arc::new(inbox);
    let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    // Every message in hand waits at most once in this queue.
    let (to_record, queue) = mpsc::channel::<Job<H::Prepared>>(spec.concurrency.max(1));
    let queue = Arc::new(tokio::sync::Mutex::new(queue));
    let recorders: Vec<_> = (0..spec.recorders.max(1))
        .map(|_| {
            let (inbox, spec, handler, queue) =
                (inbox.clone(), spec.clone(), handler.clone(), queue.clone());
            tokio::spawn(
                async move { recorder(inbox.as_ref(), &spec, handler.as_ref(), &queue).await },
            )
        })
        .collect();
    let mut messages = consumer.messages().await?;
    let mut ended = false;
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            next = messages.next() => next,
        };
        let Some(next) = next else {
            // The consumer was deleted, or the client gave up on it: nothing more
            // will arrive, so the service must not go on looking healthy.
            ended = true;
            break;
        };
        let first = match next {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, consumer = %spec.name, "pull failed; continuing");
                continue;
            }
        };
        let mut held = vec![permits.clone().acquire_owned().await?];
        let mut batch = vec![first];
        // The batch is what the pull has already buffered, up to the limit.
        while batch.len() < spec.batch_size.max(1) {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                break;
            };
            match messages.next().now_or_never() {
                Some(Some(Ok(m))) => {
                    held.push(permit);
                    batch.push(m);
                }
                _ => break,
            }
        }
        let (inbox, spec, handler, to_record) = (
            inbox.clone(),
            spec.clone(),
            handler.clone(),
            to_record.clone(),
        );
        tokio::spawn(async move {
            process(inbox.as_ref(), &spec, handler.as_ref(), &to_record, batch).await;
            drop(held);
        });
    }
    // Wait for the messages in hand; then the recorders have nothing left.
    let _ = permits
        .acquire_many(u32::try_from(spec.concurrency.max(1)).unwrap_or(1))
        .await;
    drop(to_record);
    for r in recorders {
        if let Err(e) = r.await {
            tracing::error!(error = %e, consumer = %spec.name, "a recorder ended abnormally");
        }
    }
    if ended {
        anyhow::bail!(
            "the message stream of consumer {} ended (was the consumer deleted?)",
            spec.name
        );
    }
    Ok(())
}

/// How often the consumer's lag is read from JetStream.
const LAG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Exports what the stream holds that this consumer has not finished:
/// `soldonce_consumer_pending` (not yet delivered) and
/// `soldonce_consumer_ack_pending` (delivered, not yet acknowledged). Every
/// copy of a service reads the same durable consumer, so alert on `max`.
async fn report_lag(mut consumer: jetstream::consumer::Consumer<pull::Config>, name: String) {
    loop {
        match consumer.info().await {
            Ok(info) => {
                metrics::gauge!("soldonce_consumer_pending", "consumer" => name.clone())
                    .set(info.num_pending as f64);
                metrics::gauge!("soldonce_consumer_ack_pending", "consumer" => name.clone())
                    .set(info.num_ack_pending as f64);
            }
            Err(e) => tracing::debug!(error = %e, consumer = %name, "consumer info unavailable"),
        }
        tokio::time::sleep(LAG_EVERY).await;
    }
}

/// Aborts a task when dropped, so the lag reporter ends with its consumer.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A message in a batch, with its delivery once the envelope is valid.
struct InHand {
    message: jetstream::Message,
    seq: u64,
    delivery: Arc<Delivery>,
    /// The consumer span (recorded when the message leaves the hand); the
    /// delivery's `traceparent` names it, so what the handler writes continues it.
    hop: Option<std::sync::Mutex<Hop>>,
}

async fn process<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    to_record: &mpsc::Sender<Job<H::Prepared>>,
    batch: Vec<jetstream::Message>,
) {
    metrics::histogram!("soldonce_consumer_batch_size", "consumer" => spec.name.clone())
        .record(batch.len() as f64);
    let started = Instant::now();
    let mut hand = Vec::with_capacity(batch.len());
    let mut ids = HashSet::new();
    for message in batch {
        let (seq, delivered, published_ns) = message
            .info()
            .map(|i| {
                (
                    i.stream_sequence,
                    i.delivered,
                    i128::from(i.published.timestamp_nanos_opt().unwrap_or(0)),
                )
            })
            .unwrap_or((0, 1, 0));
        let event: CloudEvent = match serde_json::from_slice(&message.payload) {
            Ok(e) => e,
            Err(e) => {
                let reason = format!("invalid envelope: {e}");
                dead_letter(inbox, spec, &message, seq, &reason).await;
                continue;
            }
        };
        if !spec.types.iter().any(|t| t == &event.event_type) {
            let reason = format!("unknown event type or version {}", event.event_type);
            dead_letter(inbox, spec, &message, seq, &reason).await;
            continue;
        }
        // The same event twice in one batch: the first one's effect is the only one.
        if !ids.insert(event.id) {
            duplicate(spec, &message).await;
            continue;
        }
        // The stage before this one: from the stream's PubAck to the handler's start.
        if published_ns > 0 && delivered == 1 {
            let now_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as i128)
                .unwrap_or(0);
            metrics::histogram!("soldonce_consumer_wait_seconds", "consumer" => spec.name.clone())
                .record((now_ns - published_ns).max(0) as f64 / 1e9);
        }
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let tracestate = platform::trace::tracestate(header("tracestate").as_deref());
        let hop = header("traceparent")
            .and_then(|v| platform::trace::TraceParent::parse(&v))
            .map(|parent| {
                let mut hop = Hop::start(
                    Kind::Consumer,
                    format!("process {}", message.subject),
                    Some(parent),
                )
                .with_tracestate(tracestate.clone());
                hop.attribute("messaging.system", "nats");
                hop.attribute("messaging.consumer.group.name", spec.name.clone());
                hop.attribute("messaging.message.id", event.id.to_string());
                hop.attribute("messaging.message.delivery_count", delivered);
                hop
            });
        let traceparent = hop.as_ref().map(|h| h.traceparent().to_string());
        hand.push(InHand {
            message,
            seq,
            delivery: Arc::new(Delivery {
                event,
                delivered,
                traceparent,
                tracestate,
            }),
            hop: hop.map(std::sync::Mutex::new),
        });
    }
    if hand.is_empty() {
        return;
    }
    // A failed look-up is no answer: the inbox rows in `begin` still dedupe.
    let event_ids: Vec<Uuid> = hand.iter().map(|h| h.delivery.event.id).collect();
    if let Ok(seen) = inbox.seen(&spec.name, &event_ids).await {
        let mut fresh = Vec::with_capacity(hand.len());
        for (h, seen) in hand.into_iter().zip(seen) {
            if seen {
                duplicate(spec, &h.message).await;
            } else {
                fresh.push(h);
            }
        }
        hand = fresh;
    }
    // Keep JetStream from redelivering messages while their handler is still at work.
    let settled: Vec<AtomicBool> = hand.iter().map(|_| AtomicBool::new(false)).collect();
    let work = handle(inbox, spec, handler, to_record, &hand, &settled, started);
    tokio::pin!(work);
    let mut beat = tokio::time::interval(spec.ack_wait / 3);
    beat.tick().await;
    loop {
        tokio::select! {
            () = &mut work => break,
            _ = beat.tick() => {
                for (h, _) in hand.iter().zip(&settled).filter(|(_, s)| !s.load(Ordering::Relaxed)) {
                    let _ = h.message.ack_with(AckKind::Progress).await;
                }
            }
        }
    }
}

/// The span a message's preparation logs under: its consumer, event id and trace id.
pub fn message_span(consumer: &str, delivery: &Delivery) -> tracing::Span {
    tracing::info_span!(
        "message",
        consumer = %consumer,
        event_id = %delivery.event.id,
        trace_id = %delivery.trace_id(),
    )
}

/// Where one message of a batch is.
enum Step<P> {
    /// Still being prepared.
    Preparing,
    /// Prepared, held back behind an earlier message of its subject.
    Prepared(P),
    /// With a recorder, not yet committed.
    Recording,
    /// Committed, or failed.
    Settled,
}

/// The prepared messages that may go to a recorder now: those that no
/// earlier message of the same subject (its order) in the batch is ahead of,
/// still being prepared or recorded. Taken in batch order.
fn take_ready<P>(subjects: &[&str], steps: &mut [Step<P>]) -> Vec<(usize, P)> {
    let mut held: HashSet<&str> = HashSet::new();
    let mut ready = Vec::new();
    for (i, subject) in subjects.iter().enumerate() {
        match &steps[i] {
            Step::Preparing | Step::Recording => {
                held.insert(subject);
            }
            Step::Prepared(_) if held.contains(subject) => {}
            Step::Prepared(_) => {
                if let Step::Prepared(p) = std::mem::replace(&mut steps[i], Step::Recording) {
                    ready.push((i, p));
                }
                held.insert(subject);
            }
            Step::Settled => {}
        }
    }
    ready
}

/// A prepared message on its way to a recorder, and where its outcome goes.
struct Job<P> {
    delivery: Arc<Delivery>,
    prepared: P,
    done: oneshot::Sender<Result<(), HandleError>>,
}

/// Prepares every delivery at once and hands each prepared one to the
/// recorders (see the module's documentation), settling each message once
/// it is committed or its preparation has failed; marks it in `settled`.
async fn handle<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    to_record: &mpsc::Sender<Job<H::Prepared>>,
    hand: &[InHand],
    settled: &[AtomicBool],
    started: Instant,
) {
    let finish = |i: usize, outcome: Result<(), HandleError>| {
        settled[i].store(true, Ordering::Relaxed);
        metrics::histogram!("soldonce_consumer_handle_seconds", "consumer" => spec.name.clone())
            .record(started.elapsed().as_secs_f64());
        settle(inbox, spec, &hand[i], outcome)
    };
    let deliveries: Vec<&Delivery> = hand.iter().map(|h| h.delivery.as_ref()).collect();
    let subjects: Vec<&str> = hand
        .iter()
        .map(|h| h.delivery.event.subject.as_str())
        .collect();
    let mut steps: Vec<Step<H::Prepared>> = hand.iter().map(|_| Step::Preparing).collect();
    let mut prepared = std::pin::pin!(handler.prepare_all(&spec.name, &deliveries));
    let mut preparing = true;
    let mut recording = FuturesUnordered::new();
    loop {
        tokio::select! {
            next = prepared.next(), if preparing => {
                // Everything prepared by now goes together.
                let mut next = Some(next);
                while let Some(item) = next.take() {
                    match item {
                        Some((i, result)) if matches!(steps.get(i), Some(Step::Preparing)) => match result {
                            Ok(p) => steps[i] = Step::Prepared(p),
                            Err(e) => {
                                steps[i] = Step::Settled;
                                finish(i, Err(e)).await;
                            }
                        },
                        Some((i, _)) => {
                            tracing::error!(consumer = %spec.name, index = i, messages = hand.len(), "prepare_all yielded an index twice or out of range");
                        }
                        None => {
                            preparing = false;
                            break;
                        }
                    }
                    next = prepared.next().now_or_never();
                }
            }
            Some((i, outcome)) = recording.next(), if !recording.is_empty() => {
                steps[i] = Step::Settled;
                finish(i, outcome).await;
            }
            else => break,
        }
        for (i, p) in take_ready(&subjects, &mut steps) {
            let (done, outcome) = oneshot::channel();
            let job = Job {
                delivery: hand[i].delivery.clone(),
                prepared: p,
                done,
            };
            if to_record.send(job).await.is_err() {
                steps[i] = Step::Settled;
                finish(
                    i,
                    Err(HandleError::Transient(anyhow::anyhow!(
                        "the consumer is stopping"
                    ))),
                )
                .await;
                continue;
            }
            recording.push(outcome.map(move |o| {
                (
                    i,
                    o.unwrap_or_else(|_| {
                        Err(HandleError::Transient(anyhow::anyhow!(
                            "its recorder ended"
                        )))
                    }),
                )
            }));
        }
    }
    // A handler's bug, not the messages': retry what it never prepared later.
    for i in 0..hand.len() {
        if matches!(steps[i], Step::Preparing) {
            tracing::error!(consumer = %spec.name, event_id = %hand[i].delivery.event.id, "prepare_all never yielded this message");
            finish(
                i,
                Err(HandleError::Transient(anyhow::anyhow!(
                    "prepare_all never yielded it"
                ))),
            )
            .await;
        }
    }
}

/// One recorder: takes every prepared message waiting (up to the batch
/// size), records them in one transaction, or each alone if that fails, and
/// answers each; until the queue closes.
async fn recorder<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    queue: &tokio::sync::Mutex<mpsc::Receiver<Job<H::Prepared>>>,
) {
    let mut jobs = Vec::with_capacity(spec.batch_size.max(1));
    loop {
        jobs.clear();
        if queue
            .lock()
            .await
            .recv_many(&mut jobs, spec.batch_size.max(1))
            .await
            == 0
        {
            return;
        }
        metrics::histogram!("soldonce_consumer_transaction_size", "consumer" => spec.name.clone())
            .record(jobs.len() as f64);
        let items: Vec<(&Delivery, &H::Prepared)> = jobs
            .iter()
            .map(|j| (j.delivery.as_ref(), &j.prepared))
            .collect();
        let began = Instant::now();
        let outcome = record(inbox, spec, handler, &items).await;
        metrics::histogram!("soldonce_consumer_transaction_seconds", "consumer" => spec.name.clone())
            .record(began.elapsed().as_secs_f64());
        let outcomes = match outcome {
            Ok(()) => items.iter().map(|_| Ok(())).collect(),
            Err(e) if items.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::warn!(error = %e, consumer = %spec.name, size = items.len(), "a transaction failed; recording its messages one by one");
                metrics::counter!("soldonce_consumer_batches_split_total", "consumer" => spec.name.clone())
                    .increment(1);
                let mut outcomes = Vec::with_capacity(items.len());
                for item in &items {
                    outcomes.push(record(inbox, spec, handler, std::slice::from_ref(item)).await);
                }
                outcomes
            }
        };
        drop(items);
        for (job, outcome) in jobs.drain(..).zip(outcomes) {
            let _ = job.done.send(outcome);
        }
    }
}

/// One transaction: the inbox rows, the fresh deliveries' effects, the commit.
async fn record<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    items: &[(&Delivery, &H::Prepared)],
) -> Result<(), HandleError> {
    // A recorder's transaction may hold messages of several batches, so the
    // same event twice (e.g. published again under another message id): the
    // first one's effect is the only one.
    let mut once = HashSet::new();
    let ids: Vec<Uuid> = items
        .iter()
        .map(|(d, _)| d.event.id)
        .filter(|id| once.insert(*id))
        .collect();
    let (mut tx, fresh) = inbox
        .begin(&spec.name, &ids)
        .await
        .map_err(|e| HandleError::Transient(anyhow::anyhow!("writing the inbox rows: {e}")))?;
    let mut fresh: HashSet<Uuid> = ids
        .iter()
        .zip(fresh)
        .filter_map(|(id, fresh)| fresh.then_some(*id))
        .collect();
    let fresh: Vec<(&Delivery, &H::Prepared)> = items
        .iter()
        .filter(|(d, _)| fresh.remove(&d.event.id))
        .copied()
        .collect();
    if fresh.len() < items.len() {
        metrics::counter!("soldonce_consumer_duplicates_total", "consumer" => spec.name.clone())
            .increment((items.len() - fresh.len()) as u64);
    }
    if fresh.is_empty() {
        // Every one was recorded before, perhaps by a commit the synchronous
        // standbys never got: the inbox's commit confirms it before the acks.
        return inbox
            .commit(tx)
            .await
            .map_err(|e| HandleError::Transient(anyhow::anyhow!("committing: {e}")));
    }
    let recorded = handler.record(&mut tx, &fresh).await?;
    inbox
        .commit(tx)
        .await
        .map_err(|e| HandleError::Transient(anyhow::anyhow!("committing: {e}")))?;
    handler.committed(recorded);
    Ok(())
}

/// Acks, retries or dead-letters one message by its outcome.
async fn settle<I: Inbox>(
    inbox: &I,
    spec: &ConsumerSpec,
    h: &InHand,
    outcome: Result<(), HandleError>,
) {
    let (message, seq, delivered) = (&h.message, h.seq, h.delivery.delivered);
    if let (Err(e), Some(hop)) = (&outcome, &h.hop) {
        if let Ok(mut hop) = hop.lock() {
            hop.fail(e);
        }
    }
    match outcome {
        Ok(()) => {
            metrics::counter!("soldonce_consumer_handled_total", "consumer" => spec.name.clone())
                .increment(1);
            let _ = message.ack().await;
        }
        Err(HandleError::Permanent(reason)) => {
            dead_letter(inbox, spec, message, seq, &reason).await
        }
        Err(HandleError::Transient(e)) if delivered >= spec.max_deliver => {
            let reason = format!("max deliveries reached: {e:#}");
            dead_letter(inbox, spec, message, seq, &reason).await;
        }
        Err(HandleError::Transient(e)) => {
            tracing::warn!(error = %format!("{e:#}"), consumer = %spec.name, event_id = %h.delivery.event.id, trace_id = %h.delivery.trace_id(), delivered, "handler failed; will retry");
            let step = usize::try_from(delivered - 1).unwrap_or(0);
            let delay = spec.backoff.get(step).or(spec.backoff.last()).copied();
            let _ = message.ack_with(AckKind::Nak(delay)).await;
        }
    }
}

/// Acks a message whose event this consumer already handled.
async fn duplicate(spec: &ConsumerSpec, message: &jetstream::Message) {
    metrics::counter!("soldonce_consumer_duplicates_total", "consumer" => spec.name.clone())
        .increment(1);
    let _ = message.ack().await;
}

/// Records a message that can never be handled and stops its redelivery.
async fn dead_letter<I: Inbox>(
    inbox: &I,
    spec: &ConsumerSpec,
    message: &jetstream::Message,
    seq: u64,
    reason: &str,
) {
    tracing::error!(consumer = %spec.name, stream_seq = seq, reason, "dead-lettering a message");
    metrics::counter!("soldonce_dead_letters_total", "consumer" => spec.name.clone()).increment(1);
    let letter = DeadLetter {
        consumer: spec.name.clone(),
        stream_seq: seq,
        subject: message.subject.to_string(),
        payload: message.payload.to_vec(),
        reason: reason.to_owned(),
    };
    match inbox.dead_letter(&letter).await {
        Ok(_) => {
            let _ = message.ack_with(AckKind::Term).await;
        }
        // Not recorded: leave it for redelivery rather than lose it.
        Err(e) => {
            tracing::error!(error = %e, "could not record the dead letter; it will be redelivered")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{take_ready, Delivery, Step};
    use uuid::Uuid;

    fn taken(ready: Vec<(usize, char)>) -> String {
        ready.into_iter().map(|(_, p)| p).collect()
    }

    #[test]
    fn what_is_prepared_goes_on_but_never_ahead_of_an_earlier_message_of_its_order() {
        // a1 is still being prepared; b and c are ready; a2 (same order as a1) is ready.
        let subjects = ["a", "b", "a", "c"];
        let mut steps = vec![
            Step::Preparing,
            Step::Prepared('b'),
            Step::Prepared('2'),
            Step::Prepared('c'),
        ];
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "bc");
        assert_eq!(
            taken(take_ready(&subjects, &mut steps)),
            "",
            "nothing new is ready"
        );
        steps[0] = Step::Prepared('1');
        assert_eq!(
            taken(take_ready(&subjects, &mut steps)),
            "1",
            "a2 waits until a1 is committed"
        );
        steps[0] = Step::Settled;
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "2");
        assert!(steps
            .iter()
            .all(|s| matches!(s, Step::Recording | Step::Settled)));
    }

    #[test]
    fn a_message_held_back_behind_its_order_also_holds_back_the_next_one() {
        let subjects = ["a", "a", "a"];
        let mut steps = vec![Step::Settled, Step::Preparing, Step::Prepared('3')];
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "");
        steps[1] = Step::Prepared('2');
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "2");
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "");
        steps[1] = Step::Settled;
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "3");
    }

    fn delivery(traceparent: Option<&str>) -> Delivery {
        let id = Uuid::now_v7();
        let meta = events::Metadata::spontaneous("test", id);
        Delivery {
            event: events::envelope::wrap(
                id,
                id,
                "order.placed.v1",
                chrono::Utc::now(),
                serde_json::json!({}),
                &meta,
            ),
            delivered: 1,
            traceparent: traceparent.map(str::to_owned),
            tracestate: None,
        }
    }

    #[test]
    fn a_delivery_logs_under_the_trace_id_its_traceparent_carries() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            delivery(Some(tp)).trace_id(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(delivery(Some("not a traceparent")).trace_id(), "");
        assert_eq!(delivery(None).trace_id(), "");
    }
}
