//! `soldonce load`: a closed-loop or open-loop load generator against a
//! running checkout. Each request carries its own Idempotency-Key; latency
//! is measured from the intended send time (no coordinated omission); the
//! accepted orders are then counted in the database.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

mod drive;
pub use drive::{drive, flash_sale, Drive};

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// checkout's base URL.
    #[arg(long, env = "CHECKOUT_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An account's API token (see `soldonce account add`), from the
    /// environment only: a secret on the command line is visible to every user of the machine.
    #[arg(skip)]
    token: String,
    /// The SKU to buy; with --sku-count N > 1, SKUs `<sku>-0` … `<sku>-(N-1)` at random.
    #[arg(long, default_value = "DEMO-TSHIRT")]
    sku: String,
    #[arg(long, default_value_t = 1)]
    sku_count: u32,
    /// Units per order.
    #[arg(long, default_value_t = 1)]
    quantity: i64,
    /// Closed loop: concurrent connections, each sending its next request when the last answered.
    #[arg(long, conflicts_with = "rate")]
    connections: Option<usize>,
    /// Closed loop: total requests.
    #[arg(long, requires = "connections")]
    requests: Option<u64>,
    /// Open loop: requests per second (e.g. 300 or 300/s), sent on schedule whatever the latency.
    #[arg(long, requires = "duration")]
    rate: Option<String>,
    /// Open loop: how long to send, e.g. 30s.
    #[arg(long)]
    duration: Option<humantime::Duration>,
    /// Skip counting accepted orders in the database (DATABASE_URL).
    #[arg(long)]
    no_verify: bool,
    /// Write every request's outcome to this file, one JSON object per line:
    /// `at_ms` (intended send time from the start), `key`, `sku`, `status`
    /// (null on a transport error), `order_id` (null unless 202) and `latency_ms`.
    #[arg(long, value_name = "FILE")]
    history: Option<std::path::PathBuf>,
}

/// The run's figures.
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: String,
    pub requests: u64,
    pub by_status: BTreeMap<String, u64>,
    pub accepted: u64,
    pub transport_errors: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub accepted_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Accepted orders found in the database, when verified.
    pub orders_in_database: Option<u64>,
}

struct Tally {
    latency: Histogram<u64>,
    by_status: BTreeMap<String, u64>,
    accepted_ids: Vec<Uuid>,
    errors: u64,
}

impl Tally {
    /// Nothing counted yet, latencies going into `latency`.
    fn empty(latency: Histogram<u64>) -> Tally {
        Tally {
            latency,
            by_status: BTreeMap::new(),
            accepted_ids: vec![],
            errors: 0,
        }
    }
}

fn parse_rate(s: &str) -> Result<f64, CliError> {
    let n = s.trim().trim_end_matches("/s").trim();
    n.parse::<f64>()
        .ok()
        .filter(|r| *r > 0.0 && r.is_finite())
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--rate {s:?}: expected requests per second such as 300 or 300/s"
            ))
        })
}

pub async fn run(mut args: LoadArgs, out: &Output) -> Result<ExitCode, CliError> {
    args.token = std::env::var("SOLDONCE_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            CliError::Usage(
                "SOLDONCE_TOKEN: set it to an account's API token (see `soldonce account add`)"
                    .into(),
            )
        })?;
    let pool = if args.no_verify {
        None
    } else {
        Some(crate::database::pool().await?)
    };
    let report = measure(&args, pool.as_ref()).await?;
    out.print(&report, || render(&report));
    if report
        .orders_in_database
        .is_some_and(|n| n != report.accepted)
    {
        eprintln!(
            "soldonce: {} orders were accepted but the database holds {:?} of them",
            report.accepted, report.orders_in_database
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(args: &LoadArgs, verify: Option<&sqlx::PgPool>) -> Result<Report, CliError> {
    if args.sku_count == 0 || args.quantity <= 0 {
        return Err(CliError::Usage(
            "--sku-count and --quantity must be at least 1".into(),
        ));
    }
    let shared = Arc::new(Shared::new(args)?);
    let started = Instant::now();
    let mode = send_load(args, &shared).await?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(history) = &shared.history {
        use std::io::Write;
        let mut file = history
            .lock()
            .map_err(|_| anyhow::anyhow!("history poisoned"))?;
        file.flush().context("writing --history")?;
    }
    let tally = std::mem::replace(
        &mut *shared
            .tally
            .lock()
            .map_err(|_| anyhow::anyhow!("tally poisoned"))?,
        Tally::empty(Histogram::new(3).context("histogram")?),
    );
    let orders_in_database = match verify {
        Some(pool) => Some(count_orders(pool, &tally.accepted_ids).await?),
        None => None,
    };
    Ok(Report::of(mode, seconds, tally, orders_in_database))
}

/// Sends the load `args` ask for, closed or open loop; returns the mode's description.
async fn send_load(args: &LoadArgs, shared: &Arc<Shared>) -> Result<String, CliError> {
    Ok(
        match (args.connections, args.requests, &args.rate, args.duration) {
            (Some(c), Some(m), None, _) if c > 0 => {
                closed_loop(shared.clone(), c, m).await;
                format!("closed loop, {c} connections, {m} requests")
            }
            (None, None, Some(rate), Some(d)) => {
                let rate = parse_rate(rate)?;
                open_loop(shared.clone(), rate, d.into()).await;
                format!("open loop, {rate}/s for {d}")
            }
            _ => {
                return Err(CliError::Usage(
                    "choose --connections N --requests M (closed loop) or --rate R/s --duration D (open loop)".into(),
                ))
            }
        },
    )
}

impl Report {
    /// The figures of a run of `seconds` from its tally.
    fn of(mode: String, seconds: f64, tally: Tally, orders_in_database: Option<u64>) -> Report {
        let requests: u64 = tally.by_status.values().sum::<u64>() + tally.errors;
        let accepted = tally.accepted_ids.len() as u64;
        let ms = |q: f64| tally.latency.value_at_quantile(q) as f64 / 1000.0;
        Report {
            mode,
            requests,
            by_status: tally.by_status,
            accepted,
            transport_errors: tally.errors,
            seconds,
            requests_per_second: requests as f64 / seconds,
            accepted_per_second: accepted as f64 / seconds,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: tally.latency.max() as f64 / 1000.0,
            orders_in_database,
        }
    }
}

/// The report as text for people.
pub fn render(r: &Report) -> String {
    let statuses: Vec<String> = r
        .by_status
        .iter()
        .map(|(s, n)| format!("{s}: {n}"))
        .collect();
    let db = r.orders_in_database.map_or("not checked".to_owned(), |n| {
        if n == r.accepted {
            format!("{n} (matches)")
        } else {
            format!("{n} (MISMATCH)")
        }
    });
    format!(
        "{}\nrequests     {} in {:.2}s ({:.0} req/s)\nby status    {}\naccepted     {} ({:.0}/s)\nerrors       {}\nlatency      p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms\nin database  {}",
        r.mode, r.requests, r.seconds, r.requests_per_second, statuses.join(", "), r.accepted, r.accepted_per_second,
        r.transport_errors, r.p50_ms, r.p99_ms, r.p999_ms, r.max_ms, db
    )
}

struct Shared {
    client: reqwest::Client,
    args_url: String,
    token: String,
    sku: String,
    sku_count: u32,
    quantity: i64,
    tally: Arc<Mutex<Tally>>,
    started: Instant,
    history: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
}

impl Shared {
    /// What every request of a run shares: the HTTP client, the order to
    /// send, the tally and the history file (created, or emptied, now).
    fn new(args: &LoadArgs) -> Result<Shared, CliError> {
        // Idle connections are dropped before checkout's HTTP_IDLE_TIMEOUT (5 s by default).
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        let latency = Histogram::new_with_bounds(1, 60_000_000, 3).context("histogram")?;
        let tally = Arc::new(Mutex::new(Tally::empty(latency)));
        let history = match &args.history {
            Some(path) => Some(Mutex::new(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .map_err(|e| CliError::Usage(format!("--history {}: {e}", path.display())))?,
            ))),
            None => None,
        };
        Ok(Shared {
            client,
            args_url: args.url.trim_end_matches('/').to_owned(),
            token: args.token.clone(),
            sku: args.sku.clone(),
            sku_count: args.sku_count,
            quantity: args.quantity,
            tally,
            started: Instant::now(),
            history,
        })
    }

    fn pick_sku(&self) -> String {
        if self.sku_count <= 1 {
            return self.sku.clone();
        }
        let i = Uuid::new_v4().as_u128() % u128::from(self.sku_count);
        format!("{}-{i}", self.sku)
    }

    /// Sends one order; `intended` is when it should have gone out.
    async fn one(&self, intended: Instant) {
        let sku = self.pick_sku();
        let key = Uuid::new_v4().to_string();
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": self.quantity }] });
        let sent = self
            .client
            .post(format!("{}/v1/orders", self.args_url))
            .bearer_auth(&self.token)
            .header("idempotency-key", &key)
            .json(&body)
            .send()
            .await;
        let outcome = match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let id = if status == 202 {
                    r.json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|b| b["id"].as_str().and_then(|s| s.parse().ok()))
                } else {
                    let _ = r.bytes().await;
                    None
                };
                Some((status, id))
            }
            Err(_) => None,
        };
        let micros = u64::try_from(intended.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Some(history) = &self.history {
            use std::io::Write;
            let line = serde_json::json!({
                "at_ms": intended.saturating_duration_since(self.started).as_millis() as u64,
                "key": key,
                "sku": sku,
                "status": outcome.map(|(status, _)| status),
                "order_id": outcome.and_then(|(_, id)| id),
                "latency_ms": micros as f64 / 1000.0,
            });
            if let Ok(mut file) = history.lock() {
                let _ = writeln!(file, "{line}");
            }
        }
        if let Ok(mut t) = self.tally.lock() {
            let _ = t.latency.record(micros.max(1));
            match outcome {
                Some((status, id)) => {
                    *t.by_status.entry(status.to_string()).or_default() += 1;
                    if let Some(id) = id {
                        t.accepted_ids.push(id);
                    }
                }
                None => t.errors += 1,
            }
        }
    }
}

async fn closed_loop(shared: Arc<Shared>, connections: usize, requests: u64) {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (shared, next) = (shared.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                    shared.one(Instant::now()).await;
                }
            })
        })
        .collect();
    futures::future::join_all(workers).await;
}

async fn open_loop(shared: Arc<Shared>, rate: f64, duration: Duration) {
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move { shared.one(at).await }));
    }
    futures::future::join_all(tasks).await;
}

/// Counts the accepted orders the database holds. A lost connection (the
/// server restarted under the load, as the chaos suite makes it) is retried
/// for about half a minute: the count is the point of the run.
async fn count_orders(pool: &sqlx::PgPool, ids: &[Uuid]) -> Result<u64, CliError> {
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(10);
    Ok((|| store::order_counts::existing(pool, ids))
        .retry(backoff)
        .when(|e| {
            e.is_unavailable()
                || matches!(e, store::StoreError::Database(sqlx::Error::Protocol(_)))
                || matches!(e, store::StoreError::Database(d) if d
                    .as_database_error()
                    .and_then(|d| d.code())
                    .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")))
        })
        .notify(|e, pause| {
            eprintln!("load: counting accepted orders failed ({e}); again in {pause:?}")
        })
        .await
        .context("counting accepted orders")?)
}
