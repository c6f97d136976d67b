//! What a consuming service gives the runtime and gets from it: its
//! [`ConsumerSpec`] and settings, the [`Handler`] it implements, and the
//! [`Delivery`] each message is handed over as.

use events::{CloudEvent, Inbox};
use futures::stream::{FuturesUnordered, Stream};
use futures::FutureExt;
use std::future::Future;
use std::time::Duration;
use tracing::Instrument;

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
    /// How messages are gathered into batches and recorded.
    pub batching: Batching,
}

/// How a consumer gathers messages into batches and records them: the
/// `CONSUMER_*` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// `CONSUMER_BATCH_SIZE`: the most messages taken in one batch and
    /// recorded in one transaction (1: one per message).
    pub batch_size: usize,
    /// `CONSUMER_RECORDERS`: transactions recording at once in this process
    /// (see the `consumer` module's documentation).
    pub recorders: usize,
    /// `CONSUMER_LINGER`: how long a batch that is not full waits after its
    /// first message for more (zero: it takes only what is already
    /// buffered). Under a light load each message is otherwise a batch, a
    /// transaction and a round of statements of its own; waiting a few
    /// milliseconds trades that much latency for fewer of them.
    pub linger: Duration,
}

/// The longest `CONSUMER_LINGER` accepted.
const MOST_LINGER: Duration = Duration::from_secs(1);

impl Batching {
    /// Reads the `CONSUMER_*` settings; `linger` is this consumer's default
    /// `CONSUMER_LINGER`.
    pub fn from_env(linger: Duration) -> Result<Batching, platform::config::ConfigError> {
        let setting = platform::config::var(
            "CONSUMER_LINGER",
            "how long a consumer's batch that is not full waits after its first message for more (0 to 1s); 0 takes only what is already buffered",
        )
        .default_shown_as("0 in payment-worker (a buyer waits on it), 20ms in fulfillment");
        let linger = setting.duration(linger)?;
        if linger > MOST_LINGER {
            return Err(platform::config::ConfigError::new(
                setting.name(),
                "must be at most 1s: a batch waits that long before it is handled",
            ));
        }
        Ok(Batching {
            batch_size: batch_size_setting()?,
            recorders: recorders_setting()?,
            linger,
        })
    }
}

/// `CONSUMER_BATCH_SIZE`, default 32 (1–1000): the most messages a
/// consumer takes at once and records in one transaction.
fn batch_size_setting() -> Result<usize, platform::config::ConfigError> {
    let setting = platform::config::var(
        "CONSUMER_BATCH_SIZE",
        "the most messages a consumer takes at once and records in one transaction (1–1000); 1 handles each alone",
    );
    count_setting(setting, 32, 1000)
}

/// `CONSUMER_RECORDERS`, by default one per core, at most 4 (1–64): the
/// transactions a consumer process records in at once, each taking every
/// prepared message waiting ([`platform::runtime::per_core`]).
fn recorders_setting() -> Result<usize, platform::config::ConfigError> {
    let setting = platform::config::var(
        "CONSUMER_RECORDERS",
        "transactions recording at once in one consumer process (1–64), each taking every prepared message waiting",
    )
    .default_shown_as("one per core, at most 4");
    count_setting(setting, platform::runtime::per_core(4), 64)
}

/// A count between 1 and `most`, or `default` when unset.
fn count_setting(
    setting: platform::config::Var,
    default: usize,
    most: usize,
) -> Result<usize, platform::config::ConfigError> {
    setting.in_range(default, 1..=most)
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

/// The span a message's preparation logs under: its consumer, event id and trace id.
pub fn message_span(consumer: &str, delivery: &Delivery) -> tracing::Span {
    tracing::info_span!(
        "message",
        consumer = %consumer,
        event_id = %delivery.event.id,
        trace_id = %delivery.trace_id(),
    )
}

#[cfg(test)]
mod tests {
    use super::Delivery;
    use uuid::Uuid;

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
