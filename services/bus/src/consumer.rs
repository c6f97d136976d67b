//! The consumer runtime: a durable pull consumer with explicit acks,
//! bounded redelivery with backoff, inbox dedupe `(consumer, event id)` in
//! the same transaction as the handler's effect, and dead letters (a row in
//! `dead_letters` plus a metric) for what can never be handled — an invalid
//! envelope, an unknown type or version, or a message out of deliveries.
//! Handlers never trust message order: they check the current state.

use async_nats::jetstream::{self, consumer::pull, AckKind};
use events::CloudEvent;
use futures::StreamExt;
use sqlx::{PgPool, Postgres, Transaction};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// How a consumer is set up on the stream.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// The durable name, also the inbox's consumer column.
    pub name: String,
    /// Subjects it reads, e.g. `soldonce.order.placed.>`.
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
    /// Worth retrying later (database or network trouble).
    #[error("transient: {0:#}")]
    Transient(anyhow::Error),
    /// Will never succeed: dead-letter it.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl From<sqlx::Error> for HandleError {
    fn from(e: sqlx::Error) -> Self {
        HandleError::Transient(e.into())
    }
}

impl From<store::StoreError> for HandleError {
    fn from(e: store::StoreError) -> Self {
        HandleError::Transient(e.into())
    }
}

/// One delivery, handed to a handler.
pub struct Delivery {
    pub event: CloudEvent,
    /// How many times this message has been delivered (1 the first time).
    pub delivered: i64,
    pub traceparent: Option<String>,
    consumer: String,
    pool: PgPool,
}

impl Delivery {
    /// Begins the transaction for the handler's effect with the inbox row
    /// already written; `None` if another delivery of this event already
    /// committed (the caller then does nothing).
    pub async fn begin(&self) -> Result<Option<Transaction<'static, Postgres>>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let fresh = sqlx::query(
            "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(&self.consumer)
        .bind(self.event.id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        Ok(fresh.then_some(tx))
    }

    /// The database, for reads outside the effect's transaction.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// What a consuming service implements.
pub trait Handler: Send + Sync + 'static {
    /// Handles one event; the effect commits through [`Delivery::begin`].
    fn handle(&self, delivery: &Delivery) -> impl Future<Output = Result<(), HandleError>> + Send;
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
    pool: PgPool,
    spec: ConsumerSpec,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let consumer = ensure_consumer(&js, &spec).await?;
    let spec = Arc::new(spec);
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
        let (pool, spec, handler) = (pool.clone(), spec.clone(), handler.clone());
        tokio::spawn(async move {
            process(&pool, &spec, handler.as_ref(), message).await;
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
    pool: &PgPool,
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
            return dead_letter(pool, spec, &message, seq, &format!("invalid envelope: {e}")).await
        }
    };
    if !spec.types.iter().any(|t| t == &event.event_type) {
        let reason = format!("unknown event type or version {}", event.event_type);
        return dead_letter(pool, spec, &message, seq, &reason).await;
    }
    let seen: Result<Option<(i32,)>, _> =
        sqlx::query_as("SELECT 1 FROM inbox WHERE consumer = $1 AND event_id = $2")
            .bind(&spec.name)
            .bind(event.id)
            .fetch_optional(pool)
            .await;
    if let Ok(Some(_)) = seen {
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
        consumer: spec.name.clone(),
        pool: pool.clone(),
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
            dead_letter(pool, spec, &message, seq, &reason).await
        }
        Err(HandleError::Transient(e)) if delivered >= spec.max_deliver => {
            dead_letter(
                pool,
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
async fn dead_letter(
    pool: &PgPool,
    spec: &ConsumerSpec,
    message: &jetstream::Message,
    seq: u64,
    reason: &str,
) {
    tracing::error!(consumer = %spec.name, stream_seq = seq, reason, "dead-lettering a message");
    metrics::counter!("soldonce_dead_letters_total", "consumer" => spec.name.clone()).increment(1);
    let recorded = sqlx::query("INSERT INTO dead_letters (consumer, stream_seq, subject, payload, reason) VALUES ($1, $2, $3, $4, $5)")
        .bind(&spec.name)
        .bind(i64::try_from(seq).unwrap_or(-1))
        .bind(message.subject.as_str())
        .bind(message.payload.as_ref())
        .bind(reason)
        .execute(pool)
        .await;
    match recorded {
        Ok(_) => {
            let _ = message.ack_with(AckKind::Term).await;
        }
        // Not recorded: leave it for redelivery rather than lose it.
        Err(e) => {
            tracing::error!(error = %e, "could not record the dead letter; it will be redelivered")
        }
    }
}
