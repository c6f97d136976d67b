//! outbox-relay: publishes committed outbox rows to JetStream. It claims
//! rows with `FOR UPDATE SKIP LOCKED` (safe with N copies), publishes each
//! with `Nats-Msg-Id` = event id, pipelines the publishes, and deletes the
//! rows only after every PubAck (a duplicate ack counts as success) in the
//! same transaction that claimed them. A crash between publish and delete
//! means a republish, which JetStream's duplicate window drops. It must
//! never delete a row it has not seen acknowledged. A row that can never
//! be published (too large for the server, a subject no stream takes, a
//! message JetStream refuses for itself) is parked in `outbox_parked` with a
//! reason instead of being retried for ever: see [`poison`].
//!
//! Layout:
//! - `lib.rs` — settings and wiring
//! - `relay/` — the lanes (`mod.rs`), their one listener and their looks (`wake.rs`); a batch's steps: `claim.rs`,
//!   `publish.rs` (with PubAck), `settle.rs` (delete, park, commit), `lag.rs` their clock;
//!   `upkeep.rs` the backlog and vacuum
//! - `poison.rs` — rows that can never be published, parked with their reason
//! - `watch.rs` — notices a stream that lost acknowledged messages and repairs it from `events`
//! - `metric_help.rs` — what each metric it records means
//! - `main.rs` — `--check-config` and the run

mod metric_help;
pub use metric_help::METRICS;
pub mod poison;
mod relay;
mod watch;

use anyhow::Context;
use platform::app::{self, App};
use platform::config::{self, ConfigError};
use platform::ops::{self, ReadinessCheck};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

pub use relay::Relay;
pub use watch::RepairSettings;

/// outbox-relay's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `OUTBOX_RELAY_ADDR`, default `127.0.0.1:8081`, for `/healthz`, `/readyz`, `/metrics`.
    pub addr: SocketAddr,
    pub database_url: String,
    /// `NATS_URL`.
    pub nats_url: String,
    /// `OUTBOX_BATCH_SIZE`, default 500: outbox rows claimed per transaction
    /// (each holds the events one statement appended).
    pub batch_size: i64,
    /// `OUTBOX_POLL_INTERVAL`, default 100ms: the fallback when no notification arrives.
    pub poll_interval: Duration,
    /// `OUTBOX_RELAY_LANES`, default 2: batches claimed and published at
    /// once, each in its own transaction.
    pub lanes: usize,
    /// `OUTBOX_VACUUM_AFTER`, default 5000: the relay vacuums the outbox
    /// each time this many rows have left it (0: never; autovacuum alone).
    pub vacuum_after: u64,
    pub stream: bus::StreamSettings,
    /// `STREAM_REPAIR_LOOKBACK` and `STREAM_REPAIR_CHECK_INTERVAL`: see [`RepairSettings`].
    pub repair: RepairSettings,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let batch_size = config::var(
            "OUTBOX_BATCH_SIZE",
            "outbox rows claimed and published per transaction (1–10000); a row holds up to 32 of the events one writing statement appended",
        )
        .in_range(500i64, 1..=10_000)?;
        let lanes = config::var(
            "OUTBOX_RELAY_LANES",
            "batches claimed and published at once, each in its own transaction (1–16): rows that commit while one awaits its acks go out in another",
        )
        .in_range(2usize, 1..=16)?;
        Ok(Settings {
            addr: config::var(
                "OUTBOX_RELAY_ADDR",
                "where /healthz /readyz /metrics listen; port 0 picks a free port",
            )
            .parsed(SocketAddr::from(([127, 0, 0, 1], 8081)))?,
            database_url: config::database_url()?,
            nats_url: config::nats_url()?,
            batch_size,
            poll_interval: config::var(
                "OUTBOX_POLL_INTERVAL",
                "how often the outbox is polled when no notification arrives (notifications are coalesced to one per 5 ms)",
            )
            .duration(Duration::from_millis(100))?,
            lanes,
            vacuum_after: config::var(
                "OUTBOX_VACUUM_AFTER",
                "vacuum the outbox each time this many rows have left it (checked every second); 0 leaves it to autovacuum",
            )
            .parsed(5000u64)?,
            stream: bus::StreamSettings::from_env()?,
            repair: RepairSettings {
                lookback: config::var(
                    "STREAM_REPAIR_LOOKBACK",
                    "how far back the relay compares the stream with events when it sees the stream go back (0: never)",
                )
                .duration(RepairSettings::default().lookback)?,
                check_every: config::var(
                    "STREAM_REPAIR_CHECK_INTERVAL",
                    "how often the relay looks whether the stream went back",
                )
                .duration(RepairSettings::default().check_every)?,
            },
        })
    }
}

/// A relay with its operations endpoint bound.
pub struct Application {
    listener: TcpListener,
    ready: ReadinessCheck,
    relay: Relay,
}

impl Application {
    /// Connects to PostgreSQL and NATS, ensures the stream, binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        platform::metric::describe(&[
            platform::metric::METRICS,
            store::METRICS,
            bus::METRICS,
            METRICS,
        ]);
        // Per lane a claiming transaction, the replication barrier and the
        // connection it looks on; one for the LISTEN, one for the gauges,
        // one for vacuuming the outbox.
        let pool = store::connect_with_settings(
            &settings.database_url,
            3 * settings.lanes as u32 + 3,
            &[store::outbox::CLAIM_SETTINGS, store::timeouts::WORKER].concat(),
        )
        .await
        .context("connecting to DATABASE_URL")?;
        let js = bus::open(&settings.nats_url, &settings.stream).await?;
        let listener = app::bind(settings.addr).await?;
        let ready = ops::all([store::readiness(pool.clone()), bus::readiness(js.client())]);
        Ok(Application {
            listener,
            ready,
            relay: Relay::new(pool, js, &settings),
        })
    }

    /// The operations endpoint's address.
    pub fn local_addr(&self) -> SocketAddr {
        app::local_addr(&self.listener)
    }

    /// Relays until `shutdown` resolves; the batch in hand is finished first.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        App::new()
            .ops(self.listener, self.ready)
            .task("relay", |stop| self.relay.run(stop))
            .run_until(shutdown)
            .await?;
        Ok(())
    }
}
