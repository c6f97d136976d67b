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

pub mod poison;
mod relay;

use anyhow::Context;
use platform::config::{self, ConfigError};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

pub use relay::Relay;

/// outbox-relay's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `OUTBOX_RELAY_ADDR`, default `127.0.0.1:8081`, for `/healthz`, `/readyz`, `/metrics`.
    pub addr: SocketAddr,
    pub database_url: String,
    /// `NATS_URL`.
    pub nats_url: String,
    /// `OUTBOX_BATCH_SIZE`, default 500: rows claimed per transaction.
    pub batch_size: i64,
    /// `OUTBOX_POLL_INTERVAL`, default 100ms: the fallback when no notification arrives.
    pub poll_interval: Duration,
    pub stream: bus::StreamSettings,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let batch_size = config::parsed("OUTBOX_BATCH_SIZE", 500i64)?;
        if !(1..=10_000).contains(&batch_size) {
            return Err(ConfigError::new(
                "OUTBOX_BATCH_SIZE",
                "must be between 1 and 10000",
            ));
        }
        Ok(Settings {
            addr: config::parsed(
                "OUTBOX_RELAY_ADDR",
                SocketAddr::from(([127, 0, 0, 1], 8081)),
            )?,
            database_url: config::database_url()?,
            nats_url: config::required("NATS_URL")?,
            batch_size,
            poll_interval: config::duration("OUTBOX_POLL_INTERVAL", Duration::from_millis(100))?,
            stream: bus::StreamSettings::from_env()?,
        })
    }
}

/// A relay with its operations endpoint bound.
pub struct Application {
    listener: TcpListener,
    relay: Relay,
}

impl Application {
    /// Connects to PostgreSQL and NATS, ensures the stream, binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = store::connect(&settings.database_url, 4)
            .await
            .context("connecting to DATABASE_URL")?;
        let js = bus::connect(&settings.nats_url)
            .await
            .context("connecting to NATS_URL")?;
        bus::ensure_stream(&js, &settings.stream)
            .await
            .context("creating the SOLDONCE stream")?;
        let listener = TcpListener::bind(settings.addr)
            .await
            .with_context(|| format!("binding {}", settings.addr))?;
        Ok(Application {
            listener,
            relay: Relay::new(pool, js, settings.batch_size, settings.poll_interval),
        })
    }

    /// The operations endpoint's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Relays until `shutdown` resolves; the batch in hand is finished first.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let server = platform::ops::spawn(
            self.listener,
            store::readiness(self.relay.pool().clone()),
            stop_rx.clone(),
        );
        let relay = tokio::spawn(self.relay.run(stop_rx));
        shutdown.await;
        let _ = stop_tx.send(true);
        relay.await.context("relay task")?;
        server.await.context("server task")??;
        Ok(())
    }
}
