//! soldonce's side of JetStream: the topology — one file-backed stream over
//! `soldonce.>`, created or updated idempotently at start, with a duplicate
//! window that turns a republished event (same `Nats-Msg-Id`) into a no-op —
//! and the consumer runtime every consuming service uses (durable pull
//! consumer, explicit ack, inbox dedupe, dead letters). It must never
//! publish without awaiting the PubAck, and never ack a message whose effect
//! has not committed.
//!
//! Layout:
//! - `lib.rs` — the stream's topology, connecting, NATS readiness
//! - `consumer/` — the consumer runtime: pull, dedupe through an `events::Inbox`, ack, retry, dead letters
//!   (`handler.rs` what a consuming service implements, `pull.rs` the pull and its batches,
//!   `record.rs` the transactions, `settle.rs` ack, retry, dead letter)
//! - `repair.rs` — the stream compared with `events` (the authority), and what it lost republished
//! - `metric_help.rs` — what each metric it records means
//! - `redrive.rs` — dead letters sent again to the consumer that gave up on them

pub mod consumer;
mod metric_help;
pub mod redrive;
pub mod repair;

pub use metric_help::METRICS;

use async_nats::jetstream::{self, stream};
use platform::config::{self, ConfigError};
use std::time::Duration;

/// The stream every soldonce event lives in.
pub const STREAM: &str = "SOLDONCE";
/// The subjects it captures: every soldonce subject.
pub const SUBJECTS: &str = events::names::ALL_SUBJECTS;
/// The header every message carries with its event's position in
/// PostgreSQL's `events`: how the stream is compared with the authority.
pub const POSITION_HEADER: &str = "Soldonce-Position";

/// How the stream is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// `STREAM_DUPLICATE_WINDOW`, default 10 minutes: republishes within it are dropped.
    pub duplicate_window: Duration,
    /// `STREAM_MAX_AGE`, default 7 days (0: no age limit). The stream is a
    /// copy of `events`, which keeps every event for ever: it needs to keep
    /// only what consumers may still have to read and replays look at.
    pub max_age: Duration,
    /// `STREAM_MAX_BYTES`, default 0 (no byte limit: NATS's store limit
    /// applies, and a full store refuses new messages). With a limit the
    /// stream drops its oldest messages to take new ones, so a full disk
    /// never stalls the relay; NATS reserves the limit on its store, so it
    /// must fit what the store may hold.
    pub max_bytes: u64,
    /// `STREAM_REPLICAS`, default 1; 3 for a cluster.
    pub replicas: usize,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 0,
            replicas: 1,
        }
    }
}

impl StreamSettings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let d = StreamSettings::default();
        let replicas = config::var(
            "STREAM_REPLICAS",
            "copies of the stream in a NATS cluster (1–5; 3 for a cluster)",
        )
        .in_range(d.replicas, 1..=5)?;
        let duplicate_window = config::var(
            "STREAM_DUPLICATE_WINDOW",
            "republishes of an event within it are dropped by the stream",
        )
        .duration(d.duplicate_window)?;
        let max_age = config::var(
            "STREAM_MAX_AGE",
            "stream retention (0: no limit); events keeps every event for ever, the stream what consumers and replays need",
        )
        .duration(d.max_age)?;
        if !max_age.is_zero() && max_age < duplicate_window {
            return Err(ConfigError::new(
                "STREAM_MAX_AGE",
                "must be 0 (no age limit) or at least STREAM_DUPLICATE_WINDOW",
            ));
        }
        Ok(StreamSettings {
            duplicate_window,
            max_age,
            max_bytes: config::var(
                "STREAM_MAX_BYTES",
                "the stream's size cap in bytes, oldest dropped first, so a full NATS disk never stops the relay (0: none)",
            )
            .parsed(d.max_bytes)?,
            replicas,
        })
    }
}

/// Why the bus could not be reached or set up.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error("cannot create or update the stream: {0}")]
    Stream(#[from] jetstream::context::CreateStreamError),
}

impl BusError {
    /// Whether JetStream only could not answer yet (a timeout, no leader, a
    /// cluster still forming); a refused configuration is not transient.
    fn is_transient(&self) -> bool {
        use async_nats::jetstream::context::CreateStreamErrorKind as Kind;
        use async_nats::jetstream::ErrorCode;
        match self {
            BusError::Connect(_) => true,
            BusError::Stream(e) => match e.kind() {
                Kind::TimedOut | Kind::JetStreamUnavailable | Kind::Response => true,
                Kind::JetStream(e) => [
                    ErrorCode::CLUSTER_NOT_AVAILABLE,
                    ErrorCode::CLUSTER_NO_PEERS,
                    ErrorCode::CLUSTER_INCOMPLETE,
                ]
                .contains(&e.error_code()),
                _ => false,
            },
        }
    }
}

/// Connects to NATS at `url` (the service's `NATS_URL`) and ensures the
/// stream: what every service on the bus does first.
pub async fn open(url: &str, stream: &StreamSettings) -> anyhow::Result<jetstream::Context> {
    use anyhow::Context;
    use backon::{ExponentialBuilder, Retryable};
    let js = connect(url).await.context("connecting to NATS_URL")?;
    // JetStream may be briefly without a leader (a cluster member restarting,
    // an election): a process starting then waits for it, for up to about
    // two minutes, instead of exiting. A refused configuration fails at once.
    (|| ensure_stream(&js, stream))
        .retry(
            ExponentialBuilder::default()
                .with_jitter()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(30),
        )
        .when(BusError::is_transient)
        .notify(|e: &BusError, after| {
            tracing::warn!(error = %e, ?after, "JetStream is not answering yet; retrying");
        })
        .await
        .context("creating the SOLDONCE stream")?;
    Ok(js)
}

/// Connects to NATS, retrying for ever in the background once connected.
/// `url` may list several servers of a cluster, comma-separated
/// (`nats://a:4222,nats://b:4222`): the client starts with any of them and
/// moves to another when one goes away.
pub async fn connect(url: &str) -> Result<jetstream::Context, BusError> {
    let servers: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let client = async_nats::ConnectOptions::new()
        .name("soldonce")
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .connect(servers)
        .await?;
    Ok(jetstream::new(client))
}

/// Creates the stream, or updates it to these settings; safe to call from every process.
pub async fn ensure_stream(
    js: &jetstream::Context,
    s: &StreamSettings,
) -> Result<stream::Info, BusError> {
    let config = stream::Config {
        name: STREAM.to_owned(),
        subjects: vec![SUBJECTS.to_owned()],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        duplicate_window: s.duplicate_window,
        max_age: s.max_age,
        max_bytes: if s.max_bytes == 0 {
            -1
        } else {
            i64::try_from(s.max_bytes).unwrap_or(i64::MAX)
        },
        discard: stream::DiscardPolicy::Old,
        num_replicas: s.replicas,
        ..Default::default()
    };
    Ok(js.create_or_update_stream(config).await?)
}

/// A readiness probe that passes while `client` is connected to NATS; it
/// asks nothing of the server, so a probe never waits on a broker that is gone.
pub fn readiness(client: async_nats::Client) -> platform::ops::ReadinessCheck {
    std::sync::Arc::new(move || {
        let state = client.connection_state();
        Box::pin(async move {
            match state {
                async_nats::connection::State::Connected => Ok(()),
                state => {
                    tracing::warn!(?state, "readiness: NATS is not connected");
                    Err("nats is unreachable".to_owned())
                }
            }
        })
    })
}
