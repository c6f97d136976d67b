//! `soldonce bench saga`: the whole saga on a private system — every
//! service but expiry (which the saga's orders never reach: they are paid
//! within their window), a PSP answering in 20 ms, warehouse steps of
//! 20 ms — for one hot SKU and for 10,000 SKUs. Per case, an open loop at
//! 300 orders/s (placement to confirmed, delivered and captured, each
//! order's own times; the stages' histograms between two scrapes; messages
//! per batch; CPU per order) and then a closed loop at 300 connections
//! (accepted and settled orders/s; CPU per order), optionally against the
//! same closed loop with checkout alone. Each open loop follows a warm-up
//! of 2 s at its rate, reported apart. The order tables are emptied
//! between phases, once the services are done with them.

use super::bins::BinDir;
use super::case::Case;
use super::cpu::Snapshot;
use super::machine::Machine;
use super::progress::Progress;
use super::saga_report::{CaseReport, ClosedLoop, Milestone, OpenLoop, SagaReport};
use super::scrape::Scrape;
use super::system::{Spec, System, Until};
use crate::load::Drive;
use crate::CliError;
use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Orders per second of the open loop.
pub const RATE: f64 = 300.0;
/// Buyers of the closed loop.
pub const CONNECTIONS: usize = 300;
/// The open loop's warm-up, at its rate, before the orders it measures: a
/// store that has been taking orders has its services' connections open
/// and their statements prepared, and its database has WAL segments ready
/// for reuse ([`store::bench::recycle_wal_segments`]). From a start, the
/// first second's orders waited for the connections to open and their
/// first statements to be planned (2 s of warm-up is 600 orders); the
/// warm-up's own times are reported apart ([`OpenLoop::warm_up`]).
const WARM_UP: Duration = Duration::from_secs(2);
/// The longest a phase may take to settle before the run fails.
const SETTLE: Duration = Duration::from_secs(600);
/// The services of the saga, started in this order.
const SAGA: [&str; 5] = [
    "psp-sim",
    "checkout",
    "outbox-relay",
    "payment-worker",
    "fulfillment",
];

/// The saga's knobs, shared with `bench compare`.
#[derive(Debug, Clone, Args)]
pub struct SagaOptions {
    /// Seconds of each loop (the closed loop sends seconds × 1,000 orders).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// The cases, comma-separated: hot (one SKU), 10k (10,000 SKUs).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "hot,10k")]
    pub cases: Vec<Case>,
    /// Only the open loops.
    #[arg(long)]
    pub no_closed: bool,
    /// psp-sim's fault knobs (its PSP_FAULTS), e.g. '{"latency_ms": 20, "drop_webhook_rate": 1}'.
    #[arg(long, value_name = "JSON", default_value = r#"{"latency_ms": 20}"#)]
    pub psp_faults: String,
    /// A PostgreSQL server setting to try, name=value (repeatable).
    #[arg(long = "pg-setting", value_name = "NAME=VALUE", value_parser = super::args::pg_setting)]
    pub pg_settings: Vec<String>,
}

/// `bench saga`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct SagaArgs {
    #[command(flatten)]
    pub options: SagaOptions,
    /// First the same closed loop with checkout alone, and the saga's reported against it.
    #[arg(long)]
    pub alone: bool,
    /// The directory of the service binaries (default: beside soldonce).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// A variable for every service, NAME=value (repeatable), e.g. CAPTURE_AT=confirmation.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = super::args::env_pair)]
    pub env: Vec<(String, String)>,
}

/// A checked run of the saga: what to start and what to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub bins: BinDir,
    pub env: Vec<(String, String)>,
    pub seconds: u64,
    pub cases: Vec<Case>,
    pub closed: bool,
    pub alone: bool,
    pub psp_faults: String,
    pub pg_settings: Vec<String>,
}

impl Plan {
    /// The plan for `options` on `bins`, or a usage error.
    pub fn new(
        options: &SagaOptions,
        bins: BinDir,
        env: Vec<(String, String)>,
        alone: bool,
    ) -> Result<Plan, CliError> {
        let faults: serde_json::Value = serde_json::from_str(&options.psp_faults)
            .map_err(|e| CliError::Usage(format!("--psp-faults: not JSON ({e})")))?;
        if !faults.is_object() {
            return Err(CliError::Usage(
                "--psp-faults: expected a JSON object".into(),
            ));
        }
        let mut cases = options.cases.clone();
        cases.dedup();
        if cases.is_empty() {
            return Err(CliError::Usage("--cases: name hot, 10k or both".into()));
        }
        Ok(Plan {
            bins,
            env,
            seconds: options.seconds,
            cases,
            closed: !options.no_closed,
            alone: alone && !options.no_closed,
            psp_faults: options.psp_faults.clone(),
            pg_settings: options.pg_settings.clone(),
        })
    }
}

/// `soldonce bench saga`.
pub async fn run(
    args: SagaArgs,
    out: &crate::output::Output,
) -> Result<std::process::ExitCode, CliError> {
    let bins = match &args.bin_dir {
        Some(dir) => BinDir::check("--bin-dir", dir)?,
        None => BinDir::beside_soldonce()?,
    };
    let plan = Plan::new(&args.options, bins, args.env.clone(), args.alone)?;
    let progress = Progress::new(out.json);
    let report = super::system::until_interrupted(measure(&plan, &progress)).await;
    progress.finish();
    let report = report?;
    out.print(&report, || super::saga_report::markdown(&report));
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs the plan: the checkout-alone loops if asked, then the saga's cases.
pub async fn measure(plan: &Plan, progress: &Progress) -> Result<SagaReport, CliError> {
    let machine = Machine::describe();
    let mut alone = Vec::new();
    if plan.alone {
        alone = measure_alone(plan, progress).await?;
    }
    progress.phase("starting the saga's system");
    let mut env = vec![
        ("ACCOUNT_RATE_LIMIT".to_owned(), "0".to_owned()),
        ("PSP_FAULTS".to_owned(), plan.psp_faults.clone()),
        ("FULFILLMENT_STEP_DELAY".to_owned(), "20ms".to_owned()),
    ];
    env.extend(plan.env.iter().cloned());
    let spec = Spec {
        bins: plan.bins.clone(),
        services: SAGA.to_vec(),
        later: 0,
        env,
        pg_settings: plan.pg_settings.clone(),
    };
    let mut system = System::start(spec).await?;
    let cases = measure_cases(&mut system, plan, &alone, progress).await;
    let webhooks = match &cases {
        Ok(_) => webhook_outcomes(&system).await,
        Err(_) => Default::default(),
    };
    progress.phase("stopping the system");
    system.stop().await;
    Ok(SagaReport {
        machine,
        binaries: plan.bins.clone(),
        env: plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        psp_faults: plan.psp_faults.clone(),
        pg_settings: plan.pg_settings.clone(),
        seconds: plan.seconds,
        rate: RATE,
        connections: CONNECTIONS,
        cases: cases?,
        webhooks,
    })
}

async fn measure_cases(
    system: &mut System,
    plan: &Plan,
    alone: &[(Case, f64)],
    progress: &Progress,
) -> Result<Vec<CaseReport>, CliError> {
    progress.phase("seeding 10,000 products");
    system.seed_products().await?;
    let mut cases = Vec::new();
    for &case in &plan.cases {
        let warmed = warm_up(system, case, progress).await?;
        progress.phase(format!(
            "{}: open loop at {RATE}/s for {} s",
            case.name(),
            plan.seconds
        ));
        let open = open_loop(system, case, plan.seconds, warmed, progress).await?;
        progress.line(format!("[{} open] {}", case.name(), open.line()));
        let alone_rate = alone.iter().find(|(c, _)| *c == case).map(|(_, r)| *r);
        let closed = if plan.closed {
            progress.phase(format!(
                "{}: closed loop, {CONNECTIONS} connections",
                case.name()
            ));
            let closed = closed_loop(system, case, plan.seconds, alone_rate, progress).await?;
            progress.line(format!("[{} closed] {}", case.name(), closed.line()));
            Some(closed)
        } else {
            None
        };
        cases.push(CaseReport {
            case,
            skus: case.skus().1,
            alone_accepted_per_second: alone_rate,
            open,
            closed,
        });
    }
    Ok(cases)
}

/// Per case, the closed loop with checkout the only service running.
async fn measure_alone(plan: &Plan, progress: &Progress) -> Result<Vec<(Case, f64)>, CliError> {
    progress.phase("starting checkout alone");
    let mut env = vec![("ACCOUNT_RATE_LIMIT".to_owned(), "0".to_owned())];
    env.extend(plan.env.iter().cloned());
    let spec = Spec {
        bins: plan.bins.clone(),
        services: vec!["checkout"],
        later: 0,
        env,
        pg_settings: plan.pg_settings.clone(),
    };
    let mut system = System::start(spec).await?;
    progress.phase("seeding 10,000 products");
    let mut rates = Vec::new();
    let measured: Result<(), CliError> = async {
        system.seed_products().await?;
        for &case in &plan.cases {
            progress.phase(format!(
                "{}: checkout alone, {CONNECTIONS} connections",
                case.name()
            ));
            system.empty_orders().await?;
            let drive = Drive::Closed {
                connections: CONNECTIONS,
                requests: plan.seconds * 1000,
            };
            let report = system.drive(case.skus(), drive, false).await?;
            progress.line(format!(
                "[{} alone] checkout alone, {CONNECTIONS} connections: {} orders accepted/s",
                case.name(),
                super::stats::thousands(report.accepted_per_second.round() as i64)
            ));
            rates.push((case, report.accepted_per_second));
        }
        Ok(())
    }
    .await;
    system.stop().await;
    measured.map(|()| rates)
}

/// The open loop of one case, after its warm-up (whose `202` → confirmed
/// is `warm_up`), and every figure read from it.
async fn open_loop(
    system: &mut System,
    case: Case,
    seconds: u64,
    warm_up: Option<Milestone>,
    progress: &Progress,
) -> Result<OpenLoop, CliError> {
    let client = reqwest::Client::new();
    let before = Scrape::take(&client, &system.metrics()).await;
    let cpu_before = Snapshot::take();
    let drive = Drive::Open {
        rate: RATE,
        duration: Duration::from_secs(seconds),
    };
    let load = system.drive(case.skus(), drive, true).await?;
    progress.phase(format!(
        "{}: open loop sent; waiting until every order is settled, delivered and captured",
        case.name()
    ));
    system.wait(Until::Finished, SETTLE).await?;
    let cpu_after = Snapshot::take();
    let after = Scrape::take(&client, &system.metrics()).await;
    let timings = store::timings::since_placed(&system.pool)
        .await
        .map_err(|e| anyhow::anyhow!("reading the orders' times: {e}"))?;
    let totals = store::order_counts::totals(&system.pool)
        .await
        .map_err(|e| anyhow::anyhow!("counting the orders: {e}"))?;
    let orders = u64::try_from(totals.orders()).unwrap_or(0);
    Ok(OpenLoop {
        requests: load.requests,
        accepted: load.accepted,
        accepted_in_database: load.orders_in_database,
        by_status: load.by_status,
        http_p50_ms: load.p50_ms,
        http_p99_ms: load.p99_ms,
        orders,
        confirmed: u64::try_from(totals.state("confirmed")).unwrap_or(0),
        warm_up,
        to_confirmed: timings.confirmed.map(Milestone::from),
        to_delivered: timings.delivered.map(Milestone::from),
        to_captured: timings.captured.map(Milestone::from),
        stages: after.stages(&before),
        messages: after.messages(&before),
        cpu: cpu_after.since(&cpu_before, orders),
    })
}

/// Drives [`WARM_UP`] of the open loop on an empty store and follows it
/// to its end; leaves the store empty again. Returns its `202` →
/// confirmed: for the run's first case, the system's first orders since
/// it started.
async fn warm_up(
    system: &mut System,
    case: Case,
    progress: &Progress,
) -> Result<Option<Milestone>, CliError> {
    progress.phase(format!(
        "{}: warming up, {RATE}/s for {} s (not measured)",
        case.name(),
        WARM_UP.as_secs()
    ));
    system.wait(Until::Idle, SETTLE).await?;
    system.empty_orders().await?;
    let drive = Drive::Open {
        rate: RATE,
        duration: WARM_UP,
    };
    system.drive(case.skus(), drive, false).await?;
    system.wait(Until::Finished, SETTLE).await?;
    let confirmed = store::timings::since_placed(&system.pool)
        .await
        .map_err(|e| anyhow::anyhow!("reading the warm-up's times: {e}"))?
        .confirmed;
    system.wait(Until::Idle, SETTLE).await?;
    system.empty_orders().await?;
    store::bench::recycle_wal_segments(&system.pool)
        .await
        .map_err(|e| anyhow::anyhow!("readying WAL segments: {e}"))?;
    Ok(confirmed.map(Milestone::from))
}

/// The closed loop of one case: accepted, and settled through the saga.
async fn closed_loop(
    system: &mut System,
    case: Case,
    seconds: u64,
    alone: Option<f64>,
    progress: &Progress,
) -> Result<ClosedLoop, CliError> {
    system.wait(Until::Idle, SETTLE).await?;
    system.empty_orders().await?;
    let started = Instant::now();
    let cpu_before = Snapshot::take();
    let drive = Drive::Closed {
        connections: CONNECTIONS,
        requests: seconds * 1000,
    };
    let load = system.drive(case.skus(), drive, true).await?;
    progress.phase(format!(
        "{}: closed loop sent; waiting until every order is settled, then delivered and captured",
        case.name()
    ));
    system.wait(Until::Settled, SETTLE).await?;
    let settled_seconds = started.elapsed().as_secs_f64();
    // The CPU of the whole saga: a capture left for later is work the
    // loop caused all the same.
    system.wait(Until::Finished, SETTLE).await?;
    let finished_seconds = started.elapsed().as_secs_f64();
    let cpu = Snapshot::take().since(&cpu_before, load.accepted);
    Ok(ClosedLoop::new(
        load,
        (settled_seconds, finished_seconds),
        alone,
        cpu,
    ))
}

/// checkout's webhook answers by outcome, over the whole run.
async fn webhook_outcomes(system: &System) -> std::collections::BTreeMap<String, u64> {
    let checkout: Vec<(String, String)> = system
        .metrics()
        .into_iter()
        .filter(|(name, _)| name == "checkout")
        .collect();
    let scrape = Scrape::take(&reqwest::Client::new(), &checkout).await;
    scrape.counts_by(&Scrape::default(), "soldonce_webhooks_total", "outcome")
}
