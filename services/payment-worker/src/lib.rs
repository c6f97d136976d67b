//! payment-worker: consumes `order.placed`, charges the order at the
//! payment provider with `Idempotency-Key: pay:<order_id>`, and records the
//! verdict (confirmed: reserved → sold; declined: payment_failed, reserved →
//! available). It must never charge with a new key, and never release stock
//! because a call timed out. It also owns the money's loose ends: it carries
//! out every recorded compensation (a refund of a payment that cannot settle
//! its order, or the void of an authorization) until the PSP confirms it,
//! captures every authorized order that shipped (`CAPTURE_AT=shipment`, the
//! default), and reconciles soldonce's books with the PSP's listing every
//! `RECONCILE_INTERVAL`.
//!
//! Layout:
//! - `lib.rs` — settings and wiring
//! - `handler.rs` — `order.placed`: charge once, learn the answer
//! - `compensate.rs` — refunds and voids owed, carried out until the PSP confirms them
//! - `capture.rs` — captures owed (an authorized order shipped), likewise
//! - `operator_refund.rs` — refunds operators asked for, likewise
//! - `metric_help.rs` — what each metric it records means
//! - `main.rs` — `--check-config` and the run
//!
//! The PSP client and reconciliation live in the `payments` library, which
//! the `soldonce` CLI uses too.

mod metric_help;
pub use metric_help::METRICS;
pub mod capture;
pub mod compensate;
mod handler;
pub mod operator_refund;
use payments::{psp, reconcile};

use anyhow::Context;
use platform::app::{self, App};
use platform::config::{self, ConfigError};
use platform::ops;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// payment-worker's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `PAYMENT_WORKER_ADDR`, default `127.0.0.1:8082`.
    pub addr: SocketAddr,
    pub database_url: String,
    pub nats_url: String,
    /// `PSP_URL`, e.g. `http://127.0.0.1:8090`.
    pub psp_url: String,
    /// `PSP_TIMEOUT`, default 2s: one call.
    pub psp_timeout: Duration,
    /// `PSP_DEADLINE`, default 30s: all retries of one action before the message is redelivered.
    pub psp_deadline: Duration,
    /// `PAYMENT_WORKER_CONCURRENCY`, default 256: orders in hand at once (their
    /// PSP calls concurrent), so several batches are in flight. It caps the
    /// orders settled per second at this number divided by an order's time
    /// in hand (PSP call, wait for a recorder, commit): 128 held a saturated
    /// saga to about 1,000 orders/s on 2 cores.
    pub concurrency: usize,
    /// `CAPTURE_CONCURRENCY`, default 64: captures asked of the PSP at once
    /// (1–1024); this divided by the PSP's answer time caps captures per second.
    pub capture_concurrency: usize,
    /// `CONSUMER_BATCH_SIZE` (default 32: orders taken at once, and the most
    /// PSP answers recorded in one transaction), `CONSUMER_RECORDERS`
    /// (one per core, at most 4: transactions recording PSP answers at once) and
    /// `CONSUMER_LINGER` (default 0: a buyer waits on every order here).
    pub batching: bus::consumer::Batching,
    /// `COMPENSATION_INTERVAL`, default 500ms: how often due refunds and
    /// captures are looked for while none are found.
    pub compensation_interval: Duration,
    /// `RECONCILE_INTERVAL`, default 60s; 0 turns periodic reconciliation off.
    pub reconcile_interval: Duration,
    /// `CAPTURE_AT`, default `shipment`: charges are authorizations,
    /// captured when the order ships; `confirmation` takes the money at once.
    pub capture_at: psp::CaptureAt,
    /// `ACTION_EXTENSION`, default 10 minutes (at most an hour): how much
    /// longer an order's reservation lasts, once, while its buyer completes
    /// a 3-D Secure challenge.
    pub action_extension: Duration,
    pub stream: bus::StreamSettings,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let psp_url = config::psp_url()?;
        // An https PSP is trusted through the platform's roots, or SSL_CERT_FILE's.
        config::ssl_cert_file()?;
        let concurrency = config::var(
            "PAYMENT_WORKER_CONCURRENCY",
            "orders in hand at once (1–1024); their PSP calls run concurrently over as many kept-alive connections",
        )
        .in_range(256usize, 1..=1024)?;
        let capture_concurrency = config::var(
            "CAPTURE_CONCURRENCY",
            "captures asked of the PSP at once (1–1024); divided by the PSP's answer time, it caps captures per second",
        )
        .in_range(capture::DEFAULT_CONCURRENCY, 1..=1024)?;
        Ok(Settings {
            addr: config::var(
                "PAYMENT_WORKER_ADDR",
                "where /healthz /readyz /metrics listen; port 0 picks a free port",
            )
            .parsed(SocketAddr::from(([127, 0, 0, 1], 8082)))?,
            database_url: config::database_url()?,
            nats_url: config::nats_url()?,
            psp_url,
            psp_timeout: config::var("PSP_TIMEOUT", "the longest one call to the PSP may take")
                .duration(Duration::from_secs(2))?,
            psp_deadline: config::var(
                "PSP_DEADLINE",
                "the longest all retries of one charge may take; then the outcome is unknown and asked by key",
            )
            .duration(Duration::from_secs(30))?,
            concurrency,
            capture_concurrency,
            batching: bus::consumer::Batching::from_env(Duration::ZERO)?,
            compensation_interval: positive(
                config::var(
                    "COMPENSATION_INTERVAL",
                    "how often refunds and captures due are looked for while none are found",
                ),
                Duration::from_millis(500),
            )?,
            reconcile_interval: config::var(
                "RECONCILE_INTERVAL",
                "how often the PSP's payment listing is reconciled with the orders (0: off)",
            )
            .duration(Duration::from_secs(60))?,
            capture_at: config::var(
                "CAPTURE_AT",
                "when an order's money is taken: shipment (authorize at checkout, capture as the order ships, void if it never does) or confirmation (at once)",
            )
            .parsed(psp::CaptureAt::Shipment)?,
            action_extension: store::payments::action_extension_setting()?,
            stream: bus::StreamSettings::from_env()?,
        })
    }
}

fn positive(setting: config::Var, default: Duration) -> Result<Duration, ConfigError> {
    let d = setting.duration(default)?;
    if d.is_zero() {
        return Err(ConfigError::new(setting.name(), "must be longer than zero"));
    }
    Ok(d)
}

/// The event the payment worker consumes.
const CONSUMES: &str = "order.placed.v1";

/// The consumer spec of the payment worker.
pub fn consumer_spec(
    concurrency: usize,
    batching: bus::consumer::Batching,
) -> bus::consumer::ConsumerSpec {
    bus::consumer::ConsumerSpec {
        name: "payment-worker".into(),
        filter_subjects: vec![events::names::subjects_of(CONSUMES)],
        types: vec![events::names::event_type(CONSUMES)],
        ack_wait: Duration::from_secs(60),
        max_deliver: 20,
        backoff: vec![
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(5),
            Duration::from_secs(10),
            Duration::from_secs(30),
        ],
        concurrency,
        batching,
    }
}

/// A payment worker, connected and bound.
pub struct Application {
    listener: TcpListener,
    pool: sqlx::PgPool,
    js: async_nats::jetstream::Context,
    psp: psp::Psp,
    concurrency: usize,
    capture_concurrency: usize,
    batching: bus::consumer::Batching,
    compensation_interval: Duration,
    reconcile_interval: Duration,
}

impl Application {
    /// Connects to PostgreSQL and NATS, ensures the stream, binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        platform::metric::describe(&[
            platform::metric::METRICS,
            store::METRICS,
            bus::METRICS,
            payments::METRICS,
            METRICS,
        ]);
        let pool_size = u32::try_from(settings.concurrency)
            .unwrap_or(32)
            .clamp(2, 64);
        let pool = store::connect_with_settings(
            &settings.database_url,
            pool_size,
            store::timeouts::WORKER,
        )
        .await
        .context("connecting to DATABASE_URL")?;
        let js = bus::open(&settings.nats_url, &settings.stream).await?;
        store::payments::set_action_extension(settings.action_extension);
        let psp = psp::Psp::new(
            &settings.psp_url,
            settings.psp_timeout,
            settings.psp_deadline,
            // One connection kept for each order in hand, the refunds' and the captures'.
            settings.concurrency
                + compensate::IN_FLIGHT
                + settings.capture_concurrency
                + operator_refund::IN_FLIGHT,
        )
        .context("PSP client")?
        .capturing_at(settings.capture_at);
        let listener = app::bind(settings.addr).await?;
        Ok(Application {
            listener,
            pool,
            js,
            psp,
            concurrency: settings.concurrency,
            capture_concurrency: settings.capture_concurrency,
            batching: settings.batching,
            compensation_interval: settings.compensation_interval,
            reconcile_interval: settings.reconcile_interval,
        })
    }

    /// The operations endpoint's address.
    pub fn local_addr(&self) -> SocketAddr {
        app::local_addr(&self.listener)
    }

    /// Consumes until `shutdown`; orders in hand are finished first.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let ready = ops::all([
            store::readiness(self.pool.clone()),
            bus::readiness(self.js.client()),
        ]);
        let (pool, psp) = (self.pool.clone(), self.psp.clone());
        let handler = Arc::new(handler::PayOrders {
            psp: self.psp,
            pool: self.pool.clone(),
        });
        App::new()
            .ops(self.listener, ready)
            .task("compensation", |stop| {
                compensation_loop(pool.clone(), psp.clone(), self.compensation_interval, stop)
            })
            .task("captures", |stop| {
                capture::run(
                    pool.clone(),
                    psp.clone(),
                    self.capture_concurrency,
                    self.compensation_interval,
                    stop,
                )
            })
            .task("reconciliation", |stop| {
                reconcile_loop(pool, psp, self.reconcile_interval, stop)
            })
            .task("consumer", |stop| {
                bus::consumer::run(
                    self.js,
                    store::inbox::PgInbox::new(self.pool),
                    consumer_spec(self.concurrency, self.batching),
                    handler,
                    stop,
                )
            })
            .run_until(shutdown)
            .await?;
        Ok(())
    }
}

/// Carries out due compensations and operator refunds every `interval`
/// (at once again while a round finds work); captures have their own
/// pipeline ([`capture::run`]).
async fn compensation_loop(
    pool: sqlx::PgPool,
    psp: psp::Psp,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let refunds = match compensate::run_due(&pool, &psp).await {
            Ok(round) => round.refunded + round.postponed + round.refused > 0,
            Err(e) => {
                tracing::warn!(error = %e, "compensation round failed; retrying");
                false
            }
        };
        let asked = match operator_refund::run_due(&pool, &psp).await {
            Ok(n) => n > 0,
            Err(e) => {
                tracing::warn!(error = %e, "operator refund round failed; retrying");
                false
            }
        };
        let busy = refunds || asked;
        if *stop.borrow() {
            return;
        }
        if !busy {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// Reconciles with the PSP every `interval` (never, if zero).
async fn reconcile_loop(
    pool: sqlx::PgPool,
    psp: psp::Psp,
    interval: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    platform::shutdown::every(interval, stop, || async {
        match reconcile::run(&pool, &psp, None, true).await {
            Ok(report) => {
                for f in report.findings.iter().filter(|f| !f.repaired) {
                    tracing::error!(kind = %f.kind, subject = %f.subject, detail = %f.detail, "reconciliation finding");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconciliation failed; retrying next interval"),
        }
    })
    .await;
}
