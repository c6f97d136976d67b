//! `soldonce bench expiry`: how fast one expiry process releases orders
//! nobody paid. checkout and the relay take N orders over the 10,000 bench
//! SKUs with a 1 s payment window; once every window has passed, one expiry
//! process (its periodic audit off) releases them all, timed until none
//! waits for its payment, with its CPU per released order (read before it
//! exits: its CPU leaves `/proc` with it). Then `soldonce audit` and
//! `soldonce replay` are timed over the result, each run as the operator
//! runs it: this binary, as a child process.

use super::bins::BinDir;
use super::cpu::{CpuUse, Snapshot};
use super::machine::Machine;
use super::progress::Progress;
use super::stats::thousands;
use super::system::{Spec, System, Until};
use crate::load::Drive;
use crate::CliError;
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `bench expiry`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct ExpiryArgs {
    /// Orders placed, each to expire unpaid.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub orders: u64,
    /// The directory of the service binaries (default: beside soldonce).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// A variable for every service, NAME=value (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = super::args::env_pair)]
    pub env: Vec<(String, String)>,
}

/// What the expiry bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct ExpiryReport {
    pub machine: Machine,
    pub binaries: BinDir,
    pub env: Vec<String>,
    /// Orders sent, and accepted by checkout.
    pub orders: u64,
    pub accepted: u64,
    /// Orders expired by the one expiry process (counted in the database).
    pub released: u64,
    pub seconds: f64,
    pub releases_per_second: f64,
    /// Per released order.
    pub cpu: CpuUse,
    pub audit: Timed,
    pub replay: Timed,
}

/// A `soldonce` command run over the result, timed.
#[derive(Debug, Clone, Serialize)]
pub struct Timed {
    pub exit_code: Option<i32>,
    /// From start to exit.
    pub wall_seconds: f64,
    /// What the command printed with `--json`.
    pub report: serde_json::Value,
}

/// `soldonce bench expiry`.
pub async fn run(args: ExpiryArgs, out: &crate::output::Output) -> Result<ExitCode, CliError> {
    let bins = match &args.bin_dir {
        Some(dir) => BinDir::check("--bin-dir", dir)?,
        None => BinDir::beside_soldonce()?,
    };
    let progress = Progress::new(out.json);
    let report = super::system::until_interrupted(measure(&args, bins, &progress)).await;
    progress.finish();
    let report = report?;
    out.print(&report, || markdown(&report));
    let clean = report.audit.report["clean"].as_bool() == Some(true);
    if !clean || report.replay.exit_code != Some(0) {
        eprintln!("soldonce: the audit or the replay over the expired orders did not pass (see the report)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    args: &ExpiryArgs,
    bins: BinDir,
    progress: &Progress,
) -> Result<ExpiryReport, CliError> {
    let machine = Machine::describe();
    let mut env = vec![
        ("ACCOUNT_RATE_LIMIT".to_owned(), "0".to_owned()),
        ("RESERVATION_TTL".to_owned(), "1s".to_owned()),
    ];
    env.extend(args.env.iter().cloned());
    let spec = Spec {
        bins: bins.clone(),
        services: vec!["checkout", "outbox-relay"],
        later: 1,
        env,
        pg_settings: vec![],
    };
    progress.phase("starting checkout and the relay");
    let mut system = System::start(spec).await?;
    let measured = release(&mut system, args.orders, progress).await;
    progress.phase("stopping the system");
    system.stop().await;
    let (accepted, released, seconds, cpu, audit, replay) = measured?;
    Ok(ExpiryReport {
        machine,
        binaries: bins,
        env: args.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        orders: args.orders,
        accepted,
        released,
        seconds,
        releases_per_second: released as f64 / seconds.max(1e-9),
        cpu,
        audit,
        replay,
    })
}

type Released = (u64, u64, f64, CpuUse, Timed, Timed);

async fn release(
    system: &mut System,
    orders: u64,
    progress: &Progress,
) -> Result<Released, CliError> {
    progress.phase("seeding 10,000 products");
    system.seed_products().await?;
    progress.phase(format!(
        "placing {} orders nobody pays",
        thousands(orders as i64)
    ));
    let drive = Drive::Closed {
        connections: 200,
        requests: orders,
    };
    let placed = system.drive(("BENCH", 10_000), drive, false).await?;
    progress.phase("waiting until every payment window has passed");
    system
        .poll("waiting for the payment windows to pass", Duration::from_secs(120), |pool| async move {
            Ok((store::order_counts::unexpired(&pool).await? == 0).then_some(()))
        })
        .await?;
    progress.phase("one expiry process releasing them");
    let cpu_before = Snapshot::take();
    let started = Instant::now();
    system
        .start_service("expiry", &[("AUDIT_INTERVAL", "0")])
        .await?;
    system
        .wait(Until::Settled, Duration::from_secs(1800))
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let totals = store::order_counts::totals(&system.pool)
        .await
        .context("counting the expired orders")?;
    // A placement that found its SKU sold out placed nothing to release.
    let released = u64::try_from(totals.state("expired")).unwrap_or(0);
    let cpu = Snapshot::take().since(&cpu_before, released);
    system.stop_service("expiry").await;
    progress.line(format!(
        "[expiry] released {} orders in {seconds:.1} s: {} releases/s; CPU {}",
        thousands(released as i64),
        thousands((released as f64 / seconds.max(1e-9)).round() as i64),
        cpu.line()
    ));
    progress.phase("soldonce audit over the result");
    let audit = soldonce(system, &["--json", "audit", "--max-outbox-age", "100000"]).await?;
    progress.phase("waiting for the relay to publish every event");
    system.wait(Until::Idle, Duration::from_secs(600)).await?;
    progress.phase("soldonce replay over the result");
    let replay = soldonce(system, &["--json", "replay"]).await?;
    Ok((placed.accepted, released, seconds, cpu, audit, replay))
}

/// Runs this `soldonce` with `args` against the system, timed.
async fn soldonce(system: &System, args: &[&str]) -> Result<Timed, CliError> {
    let exe = std::env::current_exe().context("locating the soldonce binary")?;
    let started = Instant::now();
    let output = tokio::process::Command::new(exe)
        .args(args)
        .env("DATABASE_URL", &system.database_url)
        .env("NATS_URL", &system.nats_url)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running soldonce {}", args.join(" ")))?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(
        |_| serde_json::json!({ "stderr": String::from_utf8_lossy(&output.stderr).trim() }),
    );
    Ok(Timed {
        exit_code: output.status.code(),
        wall_seconds,
        report,
    })
}

/// The report for people.
pub fn markdown(r: &ExpiryReport) -> String {
    let env = if r.env.is_empty() {
        String::new()
    } else {
        format!("; variables: {}", r.env.join(" "))
    };
    let audit = &r.audit.report;
    let replay = &r.replay.report;
    let number = |v: &serde_json::Value| {
        v.as_f64()
            .map_or("-".to_owned(), |x| thousands(x.round() as i64))
    };
    format!(
        "# soldonce bench expiry\n\n\
         - machine: {}\n- services: {}{env}\n\n\
         | measurement | figure |\n|---|---|\n\
         | orders placed with a 1 s payment window, nobody paying (accepted) | {} ({}) |\n\
         | released by one expiry process | {} in {:.1} s: {} releases/s |\n\
         | CPU per released order, every program of the system | {:.2} ms ({}) |\n\
         | `soldonce audit` over {} orders, {} events | {} in {:.2} s (exit {}) |\n\
         | `soldonce replay`: events read from the stream, validated and folded; then diffed with the database | {} in {:.2} s ({} events/s); {:.2} s in all (exit {}) |\n",
        r.machine.line(),
        r.binaries.describe(),
        thousands(r.orders as i64),
        thousands(r.accepted as i64),
        thousands(r.released as i64),
        r.seconds,
        thousands(r.releases_per_second.round() as i64),
        r.cpu.ms_per_order,
        r.cpu.by_program.iter().take(4).map(|p| format!("{} {:.2}", p.program, p.ms_per_order)).collect::<Vec<_>>().join(", "),
        number(&audit["report"]["orders"]),
        number(&audit["report"]["events"]),
        if audit["clean"].as_bool() == Some(true) { "clean" } else { "NOT CLEAN" },
        r.audit.wall_seconds,
        r.audit.exit_code.map_or("-".to_owned(), |c| c.to_string()),
        number(&replay["events"]),
        replay["seconds"].as_f64().unwrap_or(0.0),
        number(&replay["events_per_second"]),
        r.replay.wall_seconds,
        r.replay.exit_code.map_or("-".to_owned(), |c| c.to_string()),
    )
}
