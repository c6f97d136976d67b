//! A private soldonce system for one benchmark run: a PostgreSQL (fsync
//! on, as `soldonce up` runs it) and a NATS JetStream of its own in
//! temporary directories, migrated, one buyer account, and the service
//! binaries of one build directory started as child processes, their logs
//! in a temporary directory. Everything stops when the run ends, whether it
//! succeeded or not (dropped handles stop the servers and kill the children).

use super::bins::BinDir;
use crate::children;
use crate::load::{self, Drive};
use crate::CliError;
use anyhow::Context;
use localservers::{Nats, PgOptions, Postgres};
use sqlx::PgPool;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use store::order_counts::Unfinished;
use tokio::process::Child;

/// SKUs in the benchmarks' catalogue (`BENCH-0` …).
pub const BENCH_SKUS: u32 = 10_000;

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    pub bins: BinDir,
    /// Started at once, in this order.
    pub services: Vec<&'static str>,
    /// Services started later in the run ([`System::start_service`]), for each one's share of the cores.
    pub later: usize,
    /// Variables for every service, over the defaults (`NAME`, `value`).
    pub env: Vec<(String, String)>,
    /// PostgreSQL settings, each `name=value`.
    pub pg_settings: Vec<String>,
}

/// A running system.
pub struct System {
    bins: BinDir,
    env: Vec<(String, String)>,
    running: Vec<(&'static str, Child)>,
    logs: tempfile::TempDir,
    pub pool: PgPool,
    pub database_url: String,
    pub nats_url: String,
    pub checkout_url: String,
    pub token: String,
    // Dropped last: the servers stop once the pool and the services are gone.
    _nats: Nats,
    _pg: Postgres,
}

/// What a wait waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// No order waits for its payment.
    Settled,
    /// Settled, every confirmed order delivered and captured.
    Finished,
    /// Finished, and the outbox empty.
    Idle,
}

impl System {
    /// Drives this system's checkout as `soldonce load` does (see
    /// [`load::drive`]): one unit per order of `skus`; with `verify`, the
    /// accepted orders are counted in the database too.
    pub async fn drive(
        &self,
        skus: (&str, u32),
        drive: Drive,
        verify: bool,
    ) -> Result<load::Report, CliError> {
        let pool = verify.then_some(&self.pool);
        load::drive(&self.checkout_url, &self.token, skus, drive, pool).await
    }

    /// Starts the servers, migrates (with the build's own `soldonce`),
    /// creates the buyer account and starts `spec.services`.
    pub async fn start(spec: Spec) -> Result<System, CliError> {
        let logs = tempfile::Builder::new()
            .prefix("soldonce-bench-")
            .tempdir()
            .context("creating the bench's log directory")?;
        let options = PgOptions {
            durable: true,
            max_connections: 200,
            settings: spec.pg_settings.clone(),
        };
        let pg = Postgres::start_temporary(options).context("starting PostgreSQL")?;
        let nats = Nats::start_temporary().context("starting nats-server")?;
        let database_url = pg.url("postgres");
        let pool = store::connect(&database_url, 8)
            .await
            .context("connecting to the bench's PostgreSQL")?;
        migrate(&spec.bins, &database_url).await?;
        let token = store::accounts::create(&pool, "bench")
            .await
            .context("creating the bench's buyer account")?
            .token;
        let env = environment(&spec, &database_url, &nats.url())?;
        let checkout_url = format!("http://{}", lookup(&env, "CHECKOUT_ADDR"));
        let mut system = System {
            bins: spec.bins,
            env,
            running: Vec::new(),
            logs,
            pool,
            nats_url: nats.url(),
            database_url,
            checkout_url,
            token,
            _nats: nats,
            _pg: pg,
        };
        for service in spec.services {
            system.start_service(service, &[]).await?;
        }
        Ok(system)
    }

    /// Starts one more service of the build, `extra` over the system's variables, and waits until it is ready.
    pub async fn start_service(
        &mut self,
        name: &'static str,
        extra: &[(&str, &str)],
    ) -> Result<(), CliError> {
        let bins = self.bins.clone();
        self.start_service_of(&bins, name, extra).await
    }

    /// Starts one more service from another build's `bins` (the relay
    /// bench alternates builds over one system).
    pub async fn start_service_of(
        &mut self,
        bins: &BinDir,
        name: &'static str,
        extra: &[(&str, &str)],
    ) -> Result<(), CliError> {
        let mut env = self.env.clone();
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let log = self.log(name);
        let child = children::spawn_logged(&bins.binary(name), &env, &log)?;
        self.running.push((name, child));
        let probe = if name == "psp-sim" {
            "healthz"
        } else {
            "readyz"
        };
        let url = format!("http://{}/{probe}", lookup(&env, address_variable(name)));
        if let Err(e) = children::wait_ready(&url).await {
            self.check_alive()?;
            return Err(e);
        }
        Ok(())
    }

    /// Stops one service (SIGTERM: it finishes what it holds).
    pub async fn stop_service(&mut self, name: &str) {
        let (stopping, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|(n, _)| *n == name);
        self.running = kept;
        children::stop(stopping.into_iter().map(|(_, c)| c).collect()).await;
    }

    /// Each running service's metrics URL.
    pub fn metrics(&self) -> Vec<(String, String)> {
        self.running
            .iter()
            .map(|(name, _)| {
                let addr = lookup(&self.env, address_variable(name));
                ((*name).to_owned(), format!("http://{addr}/metrics"))
            })
            .collect()
    }

    /// A service that exited is a failure, named with the end of its log.
    pub fn check_alive(&mut self) -> Result<(), CliError> {
        for (name, child) in &mut self.running {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.logs.path().join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(anyhow::anyhow!(
                    "{name} exited ({status}); its last lines:\n{}",
                    tail.join("\n")
                )
                .into());
            }
        }
        Ok(())
    }

    /// Polls `check` every 100 ms until it yields a value; fails after
    /// `limit`, or as soon as a service exits.
    pub async fn poll<T, F, Fut>(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: F,
    ) -> Result<T, CliError>
    where
        F: FnMut(PgPool) -> Fut,
        Fut: Future<Output = Result<Option<T>, store::StoreError>>,
    {
        let deadline = Instant::now() + limit;
        loop {
            self.check_alive()?;
            if let Some(value) = check(self.pool.clone())
                .await
                .with_context(|| what.to_owned())?
            {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(anyhow::anyhow!("{what}: not within {} s", limit.as_secs()).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the services have done `until`, for at most `limit`.
    pub async fn wait(&mut self, until: Until, limit: Duration) -> Result<(), CliError> {
        let what = match until {
            Until::Settled => "waiting until no order waits for its payment",
            Until::Finished => "waiting until every order is settled, delivered and captured",
            Until::Idle => "waiting until every order is finished and the outbox empty",
        };
        self.poll(what, limit, |pool| async move {
            let left = store::order_counts::unfinished(&pool).await?;
            Ok(done(until, &left).then_some(()))
        })
        .await
    }

    /// The benchmarks' catalogue: SKUs `BENCH-0` … `BENCH-9999`, a billion
    /// units each (none sells out), in SQL any build's schema takes
    /// (`store::bench::seed_products`): `bench compare` seeds an older
    /// build's database with this build's code.
    pub async fn seed_products(&self) -> Result<(), CliError> {
        let skus: Vec<String> = (0..BENCH_SKUS).map(|i| format!("BENCH-{i}")).collect();
        let skus: Vec<&str> = skus.iter().map(String::as_str).collect();
        store::bench::seed_products(&self.pool, &skus, 4990, 1_000_000_000)
            .await
            .map_err(|e| anyhow::anyhow!("seeding the bench products: {e}"))?;
        Ok(())
    }

    /// Empties the order tables. A service committing at that moment can
    /// deadlock with it: tried again, up to 10 times.
    pub async fn empty_orders(&mut self) -> Result<(), CliError> {
        use backon::Retryable;
        let backoff = backon::ConstantBuilder::default()
            .with_delay(Duration::from_millis(500))
            .with_max_times(9);
        let pool = self.pool.clone();
        (|| store::bench::empty_order_tables(&pool))
            .retry(backoff)
            .when(|e| e.is_transient() || e.is_unavailable())
            .await
            .context("emptying the order tables")?;
        Ok(())
    }

    /// Stops the services, then the servers.
    pub async fn stop(mut self) {
        let running = std::mem::take(&mut self.running);
        children::stop(running.into_iter().map(|(_, c)| c).collect()).await;
        self.pool.close().await;
    }

    fn log(&self, name: &str) -> PathBuf {
        self.logs.path().join(format!("{name}.log"))
    }
}

fn done(until: Until, left: &Unfinished) -> bool {
    let settled = left.payment_pending == 0;
    let finished = settled && left.undelivered == 0 && left.uncaptured == 0;
    match until {
        Until::Settled => settled,
        Until::Finished => finished,
        Until::Idle => finished && left.outbox == 0,
    }
}

/// The variable holding a service's address (its API or ops port).
fn address_variable(service: &str) -> &'static str {
    match service {
        "checkout" => "CHECKOUT_ADDR",
        "outbox-relay" => "OUTBOX_RELAY_ADDR",
        "payment-worker" => "PAYMENT_WORKER_ADDR",
        "fulfillment" => "FULFILLMENT_ADDR",
        "expiry" => "EXPIRY_ADDR",
        _ => "PSP_SIM_ADDR",
    }
}

fn lookup<'a>(env: &'a [(String, String)], name: &str) -> &'a str {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The services' variables: as `soldonce up` sets them (a port of each
/// service's own, a fresh webhook secret, each service's share of the
/// cores), then the spec's on top.
fn environment(
    spec: &Spec,
    database_url: &str,
    nats_url: &str,
) -> Result<Vec<(String, String)>, CliError> {
    let port = || -> Result<String, CliError> {
        Ok(format!(
            "127.0.0.1:{}",
            localservers::free_port().context("finding a free port")?
        ))
    };
    let (checkout, psp) = (port()?, port()?);
    let secret = crate::up::webhook_secret();
    let share = platform::runtime::cores() / (spec.services.len() + spec.later + 2);
    let mut env: Vec<(String, String)> = [
        ("DATABASE_URL", database_url.to_owned()),
        ("NATS_URL", nats_url.to_owned()),
        ("CHECKOUT_ADDR", checkout.clone()),
        ("PSP_SIM_ADDR", psp.clone()),
        ("PSP_URL", format!("http://{psp}")),
        (
            "PSP_WEBHOOK_URL",
            format!("http://{checkout}/v1/psp/webhooks"),
        ),
        ("WEBHOOK_SECRET", secret),
        ("OUTBOX_RELAY_ADDR", port()?),
        ("PAYMENT_WORKER_ADDR", port()?),
        ("FULFILLMENT_ADDR", port()?),
        ("EXPIRY_ADDR", port()?),
        (platform::runtime::WORKER_THREADS, share.max(1).to_string()),
        ("LOG_FORMAT", "text".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(spec.env.iter().cloned());
    Ok(env)
}

/// Runs `work` until it ends or Ctrl-C: then it is dropped, and with it
/// the servers and services it started.
pub async fn until_interrupted<T>(
    work: impl Future<Output = Result<T, CliError>>,
) -> Result<T, CliError> {
    tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted").into()),
    }
}

/// Migrates the database at `database_url` with the build's own `soldonce
/// migrate`, so each build runs on the schema it was built for.
async fn migrate(bins: &BinDir, database_url: &str) -> Result<(), CliError> {
    let soldonce = bins.binary(super::bins::MIGRATOR);
    let out = tokio::process::Command::new(&soldonce)
        .arg("migrate")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", database_url)
        .output()
        .await
        .with_context(|| format!("running {} migrate", soldonce.display()))?;
    if !out.status.success() {
        return Err(anyhow::anyhow!(
            "{} migrate failed: {}",
            soldonce.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}
