//! expiry: every `EXPIRY_INTERVAL` releases `payment_pending` orders past
//! `expires_at` (each exactly once, safe with N copies), purges idempotency
//! keys, inbox rows and webhook receipts past their retention, and runs the
//! incremental audit every `AUDIT_INTERVAL` (a full pass every
//! `AUDIT_FULL_EVERY`) in a task of its own (releasing never waits for it),
//! recording each run and exporting `soldonce_audit_violations`. It must never release an
//! order whose payment window is still open.
//!
//! Layout:
//! - `lib.rs` — settings, the release/purge loop, the audit task
//! - `metric_help.rs` — what each metric it records means
//! - `main.rs` — `--check-config` and the run

mod metric_help;
pub use metric_help::METRICS;

use anyhow::Context;
use platform::app::{self, App};
use platform::config::{self, ConfigError};
use sqlx::PgPool;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// expiry's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `EXPIRY_ADDR`, default `127.0.0.1:8083`.
    pub addr: SocketAddr,
    pub database_url: String,
    /// `EXPIRY_INTERVAL`, default 1s.
    pub interval: Duration,
    /// `EXPIRY_BATCH_SIZE`, default 1000: orders released per transaction.
    pub batch_size: i64,
    /// `EXPIRY_CONCURRENCY`, default 2: release transactions in flight at once.
    pub concurrency: usize,
    /// `RETENTION`, default 24h: idempotency keys, inbox rows and webhook receipts kept this long.
    pub retention: Duration,
    /// `AUDIT_INTERVAL`, default 1m; 0 turns the periodic audit off. Each
    /// run checks what changed since the last recorded one.
    pub audit_interval: Duration,
    /// `AUDIT_FULL_EVERY`, default 1h: how often the periodic audit makes a full pass.
    pub audit_full_every: Duration,
    /// `AUDIT_PACE`, default 0.25: the share of its time the periodic
    /// incremental audit works (it rests the rest), in (0, 1].
    pub audit_pace: f64,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let interval = config::var(
            "EXPIRY_INTERVAL",
            "how often reservations past their payment window are looked for",
        )
        .duration(Duration::from_secs(1))?;
        if interval.is_zero() {
            return Err(ConfigError::new(
                "EXPIRY_INTERVAL",
                "must be longer than zero",
            ));
        }
        let batch_size = config::var(
            "EXPIRY_BATCH_SIZE",
            "orders expired and released per transaction (1–100000)",
        )
        .in_range(1000i64, 1..=100_000)?;
        let concurrency = config::var(
            "EXPIRY_CONCURRENCY",
            "release transactions in flight at once, each claiming its own batch (1–16)",
        )
        .in_range(2usize, 1..=MAX_CONCURRENCY)?;
        let retention = config::var(
            "RETENTION",
            "how long idempotency keys, inbox rows and webhook receipts are kept (over 10 minutes)",
        )
        .duration(Duration::from_secs(24 * 3600))?;
        // Webhook receipts are the replay fence: they must outlive the signature's timestamp tolerance.
        let fence = config::WEBHOOK_TOLERANCE * 2;
        if retention <= fence {
            return Err(ConfigError::new(
                "RETENTION",
                format!("must be longer than {} s (twice the webhook timestamp tolerance), or a captured webhook could be replayed", fence.as_secs()),
            ));
        }
        Ok(Settings {
            addr: config::var(
                "EXPIRY_ADDR",
                "where /healthz /readyz /metrics listen; port 0 picks a free port",
            )
            .parsed(SocketAddr::from(([127, 0, 0, 1], 8083)))?,
            database_url: config::database_url()?,
            interval,
            batch_size,
            concurrency,
            retention,
            audit_interval: config::var(
                "AUDIT_INTERVAL",
                "how often the audit checks what changed since its last run (0: off)",
            )
            .duration(Duration::from_secs(60))?,
            audit_full_every: config::var(
                "AUDIT_FULL_EVERY",
                "how often the periodic audit makes a full pass instead",
            )
            .duration(Duration::from_secs(3600))?,
            audit_pace: audit_pace()?,
        })
    }
}

/// `AUDIT_PACE`: a share in (0, 1].
fn audit_pace() -> Result<f64, ConfigError> {
    let var = config::var(
        "AUDIT_PACE",
        "the share of its time the periodic incremental audit works, in (0, 1]: it rests the rest, so a flash sale keeps the machine",
    );
    let pace: f64 = var.parsed(0.25)?;
    if !(pace > 0.0 && pace <= 1.0) {
        return Err(ConfigError::new(
            var.name(),
            format!("{pace} is not in (0, 1] (0.25: work a quarter of the time)"),
        ));
    }
    Ok(pace)
}

/// An expiry process, connected and bound.
pub struct Application {
    listener: TcpListener,
    pool: PgPool,
    settings: Settings,
}

impl Application {
    /// Connects to PostgreSQL and binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        platform::metric::describe(&[platform::metric::METRICS, store::METRICS, METRICS]);
        // A connection per release loop, plus the purge, the gauges and the audit.
        let pool = store::connect_with_settings(
            &settings.database_url,
            settings.concurrency as u32 + 3,
            store::timeouts::EXPIRY,
        )
        .await
        .context("connecting to DATABASE_URL")?;
        let listener = app::bind(settings.addr).await?;
        Ok(Application {
            listener,
            pool,
            settings,
        })
    }

    /// The operations endpoint's address.
    pub fn local_addr(&self) -> SocketAddr {
        app::local_addr(&self.listener)
    }

    /// Runs until `shutdown`; a batch in hand is finished first.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Application {
            listener,
            pool,
            settings,
        } = self;
        App::new()
            .ops(listener, store::readiness(pool.clone()))
            .task("expiry", |stop| {
                run_loop(pool.clone(), settings.clone(), stop)
            })
            .task("audit", |stop| {
                audit_loop(
                    pool,
                    settings.audit_interval,
                    settings.audit_full_every,
                    settings.audit_pace,
                    stop,
                )
            })
            .run_until(shutdown)
            .await?;
        Ok(())
    }
}

/// Most release transactions in flight at once.
pub const MAX_CONCURRENCY: usize = 16;

/// Overdue orders that could not be released (undecodable, or their stock
/// row short), kept out of later claims so they never hold back a batch;
/// each is reported once, when it is first set aside.
#[derive(Debug, Default)]
pub struct SetAside {
    orders: std::sync::Mutex<std::collections::HashSet<uuid::Uuid>>,
}

impl SetAside {
    /// The orders set aside so far.
    pub fn orders(&self) -> Vec<uuid::Uuid> {
        self.orders
            .lock()
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    fn add(&self, skipped: &[store::expiring::Skipped]) {
        let Ok(mut set) = self.orders.lock() else {
            return;
        };
        for s in skipped {
            if set.insert(s.order_id) {
                metrics::counter!("soldonce_expiry_set_aside_total").increment(1);
                tracing::error!(
                    order_id = %s.order_id,
                    reason = %s.reason,
                    "an overdue order cannot be released; it is set aside and the rest of its batch released (soldonce audit names what is wrong with it)"
                );
            }
        }
        metrics::gauge!("soldonce_expiry_set_aside").set(set.len() as f64);
    }
}

/// Releases everything overdue now, with `concurrency` transactions in
/// flight at once (each claims its own batch: `FOR UPDATE SKIP LOCKED`);
/// returns how many orders were released. Orders that cannot be released
/// are added to `aside` and left out from then on.
///
/// One loop at a time left a core idle: a batch is a claim, a load, one
/// write statement and a commit, each a wait on the other side. Two loops
/// released 1.5 times as many orders a second on 2 cores
/// (`soldonce bench expiry`); four no more than two, their write statements
/// queueing on the SKUs' stock rows they share.
pub async fn release_overdue(
    pool: &PgPool,
    batch_size: i64,
    concurrency: usize,
    aside: &SetAside,
) -> Result<u64, store::StoreError> {
    let full = u64::try_from(batch_size).unwrap_or(u64::MAX);
    // Each loop stops at a batch that was not full: nothing overdue was left
    // unclaimed then (what another loop holds, that loop releases). A loop
    // that fails returns what it released before, all of it committed.
    let release = || async {
        let mut total = 0;
        loop {
            let skip = aside.orders();
            match store::expiring::expire_due(pool, batch_size, "expiry", &skip).await {
                Ok(r) => {
                    aside.add(&r.skipped);
                    total += r.expired;
                    if r.claimed < full {
                        return (total, None);
                    }
                }
                Err(e) => return (total, Some(e)),
            }
        }
    };
    let mut total = 0;
    let mut failed = None;
    for (released, error) in
        futures::future::join_all((0..concurrency.max(1)).map(|_| release())).await
    {
        total += released;
        failed = failed.or(error);
    }
    match failed {
        // Nothing was released: the caller reports the failure; the next run retries.
        Some(e) if total == 0 => Err(e),
        // What was released is committed, so it is counted; the rest waits for the next run.
        Some(e) => {
            tracing::warn!(error = %e, released = total, "a release loop failed; the others went on");
            Ok(total)
        }
        None => Ok(total),
    }
}

async fn run_loop(pool: PgPool, s: Settings, mut stop: watch::Receiver<bool>) {
    let mut last_purge: Option<Instant> = None;
    let aside = SetAside::default();
    metrics::counter!("soldonce_expiry_set_aside_total").increment(0);
    loop {
        let released = release_overdue(&pool, s.batch_size, s.concurrency, &aside).await;
        metrics::counter!("soldonce_expiry_runs_total").increment(1);
        match released {
            Ok(n) => {
                metrics::counter!("soldonce_expirations_total").increment(n);
                metrics::gauge!("soldonce_expiry_released_last_run").set(n as f64);
                if n > 0 {
                    tracing::info!(released = n, "released expired reservations");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "releasing expired reservations failed; retrying next run")
            }
        }
        if let Ok(age) = store::orders::oldest_pending_seconds(&pool).await {
            metrics::gauge!("soldonce_oldest_pending_reservation_seconds").set(age);
        }
        if last_purge.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            match store::retention::purge(&pool, s.retention).await {
                Ok(n) => metrics::counter!("soldonce_purged_rows_total").increment(n),
                Err(e) => tracing::warn!(error = %e, "purge failed"),
            }
            last_purge = Some(Instant::now());
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(s.interval) => {}
        }
    }
}

/// Audits every `interval` (never, if zero), apart from releasing: what
/// changed since the last recorded run, a full pass every `full_every`.
async fn audit_loop(
    pool: PgPool,
    interval: Duration,
    full_every: Duration,
    pace: f64,
    stop: watch::Receiver<bool>,
) {
    let options = store::audit::AuditOptions {
        full_every,
        pace,
        ..store::audit::AuditOptions::default()
    };
    platform::shutdown::every(interval, stop, || async {
        let started = Instant::now();
        let audit = match store::audit::incremental(&pool, &options).await {
            Ok(audit) => audit,
            Err(e) => return tracing::warn!(error = %e, "audit failed"),
        };
        let report = &audit.report;
        let kind = report.kind.as_str();
        metrics::gauge!("soldonce_audit_violations").set(report.violation_count as f64);
        metrics::histogram!("soldonce_audit_seconds", "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("soldonce_audit_runs_total", "kind" => kind).increment(1);
        for v in &report.violations {
            tracing::error!(check = v.check, subject = %v.subject, detail = %v.detail, "audit violation");
        }
        if let Err(e) = audit.record(&pool).await {
            tracing::warn!(error = %e, "the audit could not be recorded");
        }
    })
    .await;
}
