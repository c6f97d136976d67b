//! `soldonce bench …`: measurement. `saga`, `compare`, `relay` and `expiry`
//! start a private system (PostgreSQL, NATS and one build's service
//! binaries, seeded through `store`) per run and print Markdown or, with
//! `--json`, the figures as numbers; `flash-sale` works on a database of
//! its own on DATABASE_URL's server.
//!
//! `soldonce bench flash-sale`: how the way a checkout writes stock decides
//! both whether a flash sale oversells and how many orders per second it can
//! take. Five strategies run against a database of the bench's own (created
//! on DATABASE_URL's server, dropped at the end): three plain SQL ones over
//! tables of their own — `naive` read-check-write (it oversells: that is the
//! point), `for-update` and `conditional` (one order per transaction) — and
//! soldonce's real checkout binary, started beside this one and driven over HTTP, with
//! coalescing off (`checkout`) and on (`coalesced`).
//!
//! Two workloads: a sellout (many buyers race for one unit, repeated; units
//! sold counted from the responses and from the database) and a closed-loop
//! throughput run on one hot SKU and on many SKUs. The hot SKU shows the
//! per-row limit: its row's lock is held until the commit's WAL flush, so a
//! strategy that commits one order per transaction sells at most one order
//! per flush; coalescing commits a whole group per flush. The bench measures;
//! it never writes to a database it did not create.
//!
//! Layout:
//! - `bench.rs` — arguments, the run over strategies, exit codes
//! - `bench/target.rs` — what a strategy is driven through: SQL or the checkout binary
//! - `bench/sql.rs` — the bench database and the plain SQL strategies (the only SQL here)
//! - `bench/workload.rs` — the sellout and the throughput loops
//! - `bench/report.rs` — figures, the machine, report.md and report.json
//! - `bench/chart.rs` — throughput.svg
//! - `bench/saga.rs`, `bench/saga_report.rs`, `bench/case.rs` — `bench saga`: the run, its figures, its two cases
//! - `bench/compare.rs` — `bench compare`: saga rounds per side, medians and ratios
//! - `bench/relay.rs` — `bench relay`: one relay draining a backlog of real orders
//! - `bench/expiry.rs` — `bench expiry`: releases/s, then audit and replay timed
//! - `bench/system.rs`, `bench/bins.rs` — a private system from a build's bin dir
//! - `bench/cpu.rs`, `bench/scrape.rs` — CPU by program from /proc; the services' histograms
//! - `bench/machine.rs`, `bench/progress.rs`, `bench/stats.rs`, `bench/args.rs` — the machine, progress lines, medians, option parsers

mod args;
mod bins;
mod case;
mod chart;
mod compare;
mod cpu;
mod expiry;
mod machine;
mod progress;
mod relay;
mod report;
mod saga;
mod saga_report;
mod scrape;
mod sql;
mod stats;
mod system;
mod target;
mod workload;

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub use report::Report;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Compare flash-sale write strategies on a database of the bench's own
    /// (created on DATABASE_URL's server and dropped at the end).
    FlashSale(FlashSaleArgs),
    /// The whole saga on a private system of one build's services: open loops
    /// at 300 orders/s (202 → confirmed, delivered, captured; the stages; CPU
    /// per order) and closed loops at 300 connections, for one hot SKU and 10,000.
    Saga(saga::SagaArgs),
    /// Two builds (or one build under two settings) through the same saga,
    /// rounds alternated, each on a fresh system: every figure's median per
    /// side with its rounds, and the ratio after/before.
    Compare(compare::CompareArgs),
    /// One relay draining a backlog of real orders after the outbox was
    /// analyzed nearly empty; events/s per round, builds alternated.
    Relay(relay::RelayArgs),
    /// One expiry process releasing orders nobody paid, then `audit` and
    /// `replay` timed over the result.
    Expiry(expiry::ExpiryArgs),
}

/// The flash-sale bench's knobs.
#[derive(Debug, Clone, Args)]
pub struct FlashSaleArgs {
    /// Strategies to compare, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "naive,for-update,conditional,checkout,coalesced"
    )]
    pub strategies: Vec<Strategy>,
    /// Sellout runs per strategy (each: --buyers buyers race for one unit).
    #[arg(long, default_value_t = 10)]
    pub runs: u32,
    /// Concurrent buyers in each sellout run.
    #[arg(long, default_value_t = 300)]
    pub buyers: usize,
    /// Seconds of each throughput case.
    #[arg(long, default_value_t = 10.0, value_parser = crate::seconds)]
    pub seconds: f64,
    /// Concurrent buyers in the throughput cases (closed loop).
    #[arg(long, default_value_t = 300)]
    pub connections: usize,
    /// SKUs in the many-SKU throughput case.
    #[arg(long, default_value_t = 10_000)]
    pub skus: u32,
    /// Connections the SQL strategies share among their buyers.
    #[arg(long, default_value_t = 64)]
    pub pool: u32,
    /// checkout's DATABASE_POOL_SIZE.
    #[arg(long, default_value_t = 32)]
    pub checkout_pool: u32,
    /// Where report.md, report.json and throughput.svg go.
    #[arg(long, default_value = "bench-report/flash-sale")]
    pub out: PathBuf,
    /// Keep the bench database instead of dropping it.
    #[arg(long)]
    pub keep_database: bool,
}

/// How a flash-sale checkout writes its stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Read, check, then decrement unconditionally: oversells.
    Naive,
    /// Lock the row with SELECT … FOR UPDATE, check, decrement.
    ForUpdate,
    /// One conditional UPDATE … WHERE available >= qty per order.
    Conditional,
    /// soldonce's checkout with coalescing off.
    Checkout,
    /// soldonce's checkout with coalescing on.
    Coalesced,
}

impl Strategy {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::ForUpdate => "for-update",
            Strategy::Conditional => "conditional",
            Strategy::Checkout => "checkout",
            Strategy::Coalesced => "coalesced",
        }
    }

    /// Whether overselling is this strategy's expected flaw rather than a bug.
    pub fn may_oversell(self) -> bool {
        self == Strategy::Naive
    }
}

/// Checks the arguments; every complaint is a usage error.
fn validate(args: &mut FlashSaleArgs) -> Result<(), CliError> {
    let mut seen = Vec::new();
    args.strategies.retain(|s| {
        let first = !seen.contains(s);
        seen.push(*s);
        first
    });
    let problem = if args.strategies.is_empty() {
        Some("--strategies: name at least one strategy".to_owned())
    } else if !(1..=1000).contains(&args.runs) {
        Some(format!("--runs {}: expected 1 to 1000", args.runs))
    } else if !(1..=100_000).contains(&args.buyers) {
        Some(format!("--buyers {}: expected 1 to 100000", args.buyers))
    } else if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        Some(format!(
            "--seconds {}: expected more than 0, at most 3600",
            args.seconds
        ))
    } else if !(1..=100_000).contains(&args.connections) {
        Some(format!(
            "--connections {}: expected 1 to 100000",
            args.connections
        ))
    } else if !(1..=1_000_000).contains(&args.skus) {
        Some(format!("--skus {}: expected 1 to 1000000", args.skus))
    } else if !(1..=1000).contains(&args.pool) {
        Some(format!("--pool {}: expected 1 to 1000", args.pool))
    } else if !(1..=1000).contains(&args.checkout_pool) {
        Some(format!(
            "--checkout-pool {}: expected 1 to 1000",
            args.checkout_pool
        ))
    } else {
        None
    };
    problem.map_or(Ok(()), |p| Err(CliError::Usage(p)))
}

/// `soldonce bench …`.
pub async fn run(cmd: BenchCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        BenchCommand::FlashSale(args) => run_flash_sale(args, out).await,
        BenchCommand::Saga(args) => saga::run(args, out).await,
        BenchCommand::Compare(args) => compare::run(args, out).await,
        BenchCommand::Relay(args) => relay::run(args, out).await,
        BenchCommand::Expiry(args) => expiry::run(args, out).await,
    }
}

async fn run_flash_sale(args: FlashSaleArgs, out: &Output) -> Result<ExitCode, CliError> {
    let url = platform::config::database_url().map_err(|e| CliError::Usage(e.to_string()))?;
    let progress = progress_bar(&args, out);
    let report = flash_sale(&url, args.clone(), &progress).await;
    progress.finish_and_clear();
    let report = report?;
    report::write_files(&report, &args.out)?;
    out.print(&report, || report::markdown(&report));
    if !report.database_dropped {
        eprintln!("soldonce: kept the bench database {}", report.database);
    }
    let troubles = report.troubles();
    for trouble in &troubles {
        eprintln!("soldonce: {trouble}");
    }
    Ok(if troubles.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn progress_bar(args: &FlashSaleArgs, out: &Output) -> ProgressBar {
    let steps = args.strategies.len() as u64 * (u64::from(args.runs) + 2);
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if out.json {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// Runs the bench on a fresh database on `server_url`'s server and drops
/// that database afterwards, whether the bench succeeded or not (unless
/// `--keep-database`), and on Ctrl-C.
pub async fn flash_sale(
    server_url: &str,
    mut args: FlashSaleArgs,
    progress: &ProgressBar,
) -> Result<Report, CliError> {
    validate(&mut args)?;
    let database = sql::BenchDatabase::create(server_url).await?;
    let measured = tokio::select! {
        measured = measure(&database, &args, progress) => measured,
        _ = tokio::signal::ctrl_c() => Err(CliError::Failed(anyhow::anyhow!("interrupted"))),
    };
    let dropped = if args.keep_database {
        Ok(false)
    } else {
        database.drop_database().await.map(|()| true)
    };
    let mut report = measured?;
    report.database_dropped = dropped.context("dropping the bench database")?;
    Ok(report)
}

async fn measure(
    database: &sql::BenchDatabase,
    args: &FlashSaleArgs,
    progress: &ProgressBar,
) -> Result<Report, CliError> {
    let server = database.server_facts().await?;
    // One strategy runs at a time; the fixtures' pool and a spare come on top.
    let wanted = args.pool.max(args.checkout_pool) + 10;
    if wanted > server.max_connections {
        return Err(CliError::Usage(format!(
            "--pool {} / --checkout-pool {}: the server allows {} connections, and the bench needs about 10 more besides",
            args.pool, args.checkout_pool, server.max_connections
        )));
    }
    let machine = report::Machine::describe(&server);
    let mut fixtures = target::Fixtures::prepare(database.url(), args.skus).await?;
    let mut strategies = Vec::with_capacity(args.strategies.len());
    for &strategy in &args.strategies {
        let driven = target::Target::start(strategy, &fixtures, args).await?;
        let measured = measure_strategy(strategy, &driven, &mut fixtures, args, progress).await;
        driven.stop().await;
        strategies.push(measured?);
    }
    fixtures.close().await;
    Ok(Report {
        machine,
        database: database.name().to_owned(),
        database_dropped: false,
        settings: report::Settings::from(args),
        strategies,
    })
}

async fn measure_strategy(
    strategy: Strategy,
    target: &target::Target,
    fixtures: &mut target::Fixtures,
    args: &FlashSaleArgs,
    progress: &ProgressBar,
) -> Result<report::StrategyReport, CliError> {
    let mut sellout = Vec::with_capacity(args.runs as usize);
    for run in 1..=args.runs {
        progress.set_message(format!("{}: sellout run {run}", strategy.name()));
        let sku = target.stock_one_unit(fixtures, run).await?;
        let answers = workload::sellout(target, &sku, args.buyers).await;
        let counted = target.count_sold(fixtures, &sku).await?;
        sellout.push(report::SelloutRun::new(run, sku, answers, counted));
        progress.inc(1);
    }
    let seconds = Duration::from_secs_f64(args.seconds);
    progress.set_message(format!("{}: one hot SKU", strategy.name()));
    let hot = vec![target.stock_hot_sku(fixtures).await?];
    let hot = workload::throughput(target, hot, args.connections, seconds).await?;
    progress.inc(1);
    progress.set_message(format!("{}: {} SKUs", strategy.name(), args.skus));
    let many = target.stock_many_skus(fixtures).await?;
    let many = workload::throughput(target, many, args.connections, seconds).await?;
    progress.inc(1);
    Ok(report::StrategyReport::new(strategy, sellout, hot, many))
}
