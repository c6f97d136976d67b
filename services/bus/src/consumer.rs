//! The consumer runtime: a durable pull consumer with explicit acks,
//! bounded redelivery with backoff, inbox dedupe `(consumer, event id)` in
//! the same transaction as the handler's effect, and dead letters (a record
//! plus a metric) for what can never be handled — an invalid envelope, an
//! unknown type or version, or a message out of deliveries. Where the inbox
//! and the dead letters are kept is the [`Inbox`]'s business, never this
//! module's. Handlers never trust message order: they check the current state.

use async_nats::jetstream::{self, consumer::pull, AckKind};
use events::{CloudEvent, DeadLetter, Inbox};
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

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
    /// Messages handled at once by this process.
    pub concurrency: usize,
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
pub struct Delivery<I: Inbox> {
    pub event: CloudEvent,
    /// How many times this message has been delivered (1 the first time).
    pub delivered: i64,
    pub traceparent: Option<String>,
    consumer: Arc<str>,
    inbox: Arc<I>,
}

impl<I: Inbox> Delivery<I> {
    /// Begins the transaction for the handler's effect with the inbox row
    /// already written; `None` if another delivery of this event already
    /// committed (the caller then does nothing).
    pub async fn begin(&self) -> Result<Option<I::Tx>, I::Error> {
        self.inbox.begin(&self.consumer, self.event.id).await
    }
}

/// What a consuming service implements.
pub trait Handler: Send + Sync + 'static {
    /// Where this handler's effects and their inbox rows are kept.
    type Inbox: Inbox;

    /// Handles one event; the effect commits through [`Delivery::begin`].
    fn handle(
        &self,
        delivery: &Delivery<Self::Inbox>,
    ) -> impl Future<Output = Result<(), HandleError>> + Send;
}

/// Creates (or updates) the durable consumer on the stream.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
) -> anyhow::Result<jetstream::consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(crate::STREAM).await?;
    let config = pull::Config {
        durable_name: Some(spec.name.clone()),
        filter_subjects: spec.filter_subjects.clone(),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: spec.max_deliver,
        max_ack_pending: i64::try_from(spec.concurrency * 4).unwrap_or(1000),
        ..Default::default()
    };
    Ok(stream.create_consumer(config).await?)
}

/// Consumes until `stop` turns true; a message in hand is finished first.
pub async fn run<H: Handler>(
    js: jetstream::Context,
    inbox: H::Inbox,
    spec: ConsumerSpec,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let consumer = ensure_consumer(&js, &spec).await?;
    let spec = Arc::new(spec);
    let inbox = Arc::new(inbox);
    let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    let mut messages = consumer.messages().await?;
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            next = messages.next() => next,
        };
        let Some(next) = next else { break };
        let message = match next {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, consumer = %spec.name, "pull failed; continuing");
                continue;
            }
        };
        let permit = permits.clone().acquire_owned().await?;
        let (inbox, spec, handler) = (inbox.clone(), spec.clone(), handler.clone());
        tokio::spawn(async move {
            process(&inbox, &spec, handler.as_ref(), message).await;
            drop(permit);
        });
    }
    // Wait for the messages in hand.
    let _ = permits
        .acquire_many(u32::try_from(spec.concurrency.max(1)).unwrap_or(1))
        .await;
    Ok(())
}

async fn process<H: Handler>(
    inbox: &Arc<H::Inbox>,
    spec: &ConsumerSpec,
    handler: &H,
    message: jetstream::Message,
) {
    let (seq, delivered) = message
        .info()
        .map(|i| (i.stream_sequence, i.delivered))
        .unwrap_or((0, 1));
    let event: CloudEvent = match serde_json::from_slice(&message.payload) {
        Ok(e) => e,
        Err(e) => {
            return dead_letter(
                inbox.as_ref(),
                spec,
                &message,
                seq,
                &format!("invalid envelope: {e}"),
            )
            .await
        }
    };
    if !spec.types.iter().any(|t| t == &event.event_type) {
        let reason = format!("unknown event type or version {}", event.event_type);
        return dead_letter(inbox.as_ref(), spec, &message, seq, &reason).await;
    }
    // A failed look-up is no answer: the inbox row in `begin` still dedupes.
    if let Ok(true) = inbox.seen(&spec.name, event.id).await {
        metrics::counter!("soldonce_consumer_duplicates_total", "consumer" => spec.name.clone())
            .increment(1);
        let _ = message.ack().await;
        return;
    }
    let traceparent = message
        .headers
        .as_ref()
        .and_then(|h| h.get("traceparent"))
        .map(|v| v.as_str().to_owned());
    let delivery = Delivery {
        event,
        delivered,
        traceparent,
        consumer: spec.name.as_str().into(),
        inbox: inbox.clone(),
    };
    // Keep JetStream from redelivering a message while its handler is still at work.
    let handled = {
        let work = handler.handle(&delivery);
        tokio::pin!(work);
        let mut beat = tokio::time::interval(spec.ack_wait / 3);
        beat.tick().await;
        loop {
            tokio::select! {
                result = &mut work => break result,
                _ = beat.tick() => {
                    let _ = message.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    match handled {
        Ok(()) => {
            metrics::counter!("soldonce_consumer_handled_total", "consumer" => spec.name.clone())
                .increment(1);
            let _ = message.ack().await;
        }
        Err(HandleError::Permanent(reason)) => {
            dead_letter(inbox.as_ref(), spec, &message, seq, &reason).await
        }
        Err(HandleError::Transient(e)) if delivered >= spec.max_deliver => {
            dead_letter(
                inbox.as_ref(),
                spec,
                &message,
                seq,
                &format!("max deliveries reached: {e:#}"),
            )
            .await;
        }
        Err(HandleError::Transient(e)) => {
            tracing::warn!(error = %format!("{e:#}"), consumer = %spec.name, delivered, "handler failed; will retry");
            let step = usize::try_from(delivered - 1).unwrap_or(0);
            let delay = spec.backoff.get(step).or(spec.backoff.last()).copied();
            let _ = message.ack_with(AckKind::Nak(delay)).await;
        }
    }
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
