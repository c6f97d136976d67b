//! Pulling: the durable consumer on the stream, its messages taken in
//! batches and opened into deliveries, and the lag it reports.

use super::handler::{Batching, ConsumerSpec, Delivery, Handler};
use super::record::{handle, recorder, Job};
use super::settle::{dead_letter, duplicate, may_be_a_copy, InHand};
use async_nats::jetstream::{self, consumer::pull, AckKind};
use events::{CloudEvent, Inbox};
use futures::{FutureExt, StreamExt};
use platform::otel::{Hop, Kind};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, watch, AcquireError, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

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
    let recorders: Vec<_> = (0..spec.batching.recorders.max(1))
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
        let (batch, held) = take_batch(first, &mut messages, &permits, &spec.batching).await?;
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

/// A batch starting with `first`, each message with the permit it holds:
/// `first` waits for its permit; the rest is what the pull has already
/// buffered and, for up to `linger` after `first`, what arrives meanwhile,
/// up to `batch_size` messages (never more than there are permits).
async fn take_batch(
    first: jetstream::Message,
    messages: &mut pull::Stream,
    permits: &Arc<Semaphore>,
    batching: &Batching,
) -> Result<(Vec<jetstream::Message>, Vec<OwnedSemaphorePermit>), AcquireError> {
    let most = batching.batch_size.max(1);
    let until = tokio::time::Instant::now() + batching.linger;
    let mut held = vec![permits.clone().acquire_owned().await?];
    let mut batch = vec![first];
    while batch.len() < most {
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            break;
        };
        // What the pull has buffered comes at once; then more, until the linger ends.
        let next = match messages.next().now_or_never() {
            Some(next) => next,
            None if batching.linger.is_zero() => break,
            None => match tokio::time::timeout_at(until, messages.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        match next {
            Some(Ok(m)) => {
                held.push(permit);
                batch.push(m);
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pull failed; continuing");
                break;
            }
            // The stream's end: the main loop meets it at its next pull.
            None => break,
        }
    }
    Ok((batch, held))
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

/// Opens a batch's messages into deliveries (dead-lettering what cannot be
/// handled, acking duplicates) and handles the rest, with progress acks
/// while they are at work.
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
        if let Some(h) = open(inbox, spec, message, &mut ids).await {
            hand.push(h);
        }
    }
    if hand.is_empty() {
        return;
    }
    // Only what may be a second copy is looked for before the work; a
    // failed look-up is no answer: the inbox rows in `begin` still dedupe.
    let suspects: Vec<Uuid> = hand
        .iter()
        .filter(|h| h.suspect)
        .map(|h| h.delivery.event.id)
        .collect();
    let seen = match suspects.is_empty() {
        true => Ok(vec![]),
        false => inbox.seen(&spec.name, &suspects).await,
    };
    if let Ok(seen) = seen {
        let seen: HashSet<Uuid> = suspects
            .into_iter()
            .zip(seen)
            .filter_map(|(id, seen)| seen.then_some(id))
            .collect();
        let mut fresh = Vec::with_capacity(hand.len());
        for h in hand {
            if seen.contains(&h.delivery.event.id) {
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

/// Opens one message of a batch into a delivery in hand, recording its wait
/// and starting its consumer span; `None` once it is dead-lettered (an
/// invalid envelope, a type this consumer does not know) or acked as the
/// same event as one earlier in its batch (`ids`).
async fn open<I: Inbox>(
    inbox: &I,
    spec: &ConsumerSpec,
    message: jetstream::Message,
    ids: &mut HashSet<Uuid>,
) -> Option<InHand> {
    let (seq, delivered, published) = message
        .info()
        .map(|i| (i.stream_sequence, i.delivered, Some(i.published)))
        .unwrap_or((0, 1, None));
    let event: CloudEvent = match serde_json::from_slice(&message.payload) {
        Ok(e) => e,
        Err(e) => {
            let reason = format!("invalid envelope: {e}");
            dead_letter(inbox, spec, &message, seq, &reason).await;
            return None;
        }
    };
    if !spec.types.iter().any(|t| t == &event.event_type) {
        let reason = format!("unknown event type or version {}", event.event_type);
        dead_letter(inbox, spec, &message, seq, &reason).await;
        return None;
    }
    // The same event twice in one batch: the first one's effect is the only one.
    if !ids.insert(event.id) {
        duplicate(spec, &message).await;
        return None;
    }
    // The stage before this one: from the stream's PubAck to the handler's start.
    if let Some(published) = published.filter(|_| delivered == 1) {
        let waited = (chrono::Utc::now() - published)
            .to_std()
            .unwrap_or_default();
        metrics::histogram!("soldonce_consumer_wait_seconds", "consumer" => spec.name.clone())
            .record(waited.as_secs_f64());
    }
    // Without the stream's publish time, look it up.
    let suspect = published.is_none_or(|p| may_be_a_copy(delivered, event.time, p));
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
    Some(InHand {
        message,
        seq,
        delivery: Arc::new(Delivery {
            event,
            delivered,
            traceparent,
            tracestate,
        }),
        suspect,
        hop: hop.map(std::sync::Mutex::new),
    })
}
