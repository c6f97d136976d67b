//! `soldonce bench relay`: how fast one relay drains a backlog. Each round,
//! for each build in turn, over one system with checkout running and no
//! relay: the outbox is first brought to the state a queue table is often
//! analyzed in between two bursts — 8,000 orders placed and relayed,
//! `--left` more placed, then `VACUUM (ANALYZE, TRUNCATE false)`, so the
//! planner believes it nearly empty over a file of many pages — then
//! `--rows` orders are placed through checkout (real orders, their real
//! outbox rows), and one relay of the build is started and timed until the
//! outbox is empty, or for at most 120 s. Events/s per round, and each
//! build's median.

use super::bins::BinDir;
use super::machine::Machine;
use super::progress::Progress;
use super::stats::{figure, median, ratio, thousands};
use super::system::{Spec, System};
use crate::load::Drive;
use crate::CliError;
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest a drain is timed.
const DRAIN_CAP: Duration = Duration::from_secs(120);
/// Orders placed and relayed before the outbox is analyzed.
const BEFORE_ANALYZE: u64 = 8_000;

/// `bench relay`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Orders in each round's backlog (one event each; checkout writes one outbox row per group it places).
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub rows: u64,
    /// Rounds; in each, every build drains once, in turn.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// A build's directory of service binaries (repeatable: builds alternated; default: beside soldonce).
    #[arg(long = "bin-dir", value_name = "DIR")]
    pub bin_dirs: Vec<PathBuf>,
    /// Orders left in the outbox when it is analyzed (0: the planner then counts any backlog as one row).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=8_000))]
    pub left: u64,
}

/// What the relay bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct RelayReport {
    pub machine: Machine,
    pub rows: u64,
    pub rounds: u32,
    pub left: u64,
    pub builds: Vec<BuildDrains>,
}

/// One build's drains.
#[derive(Debug, Clone, Serialize)]
pub struct BuildDrains {
    pub binaries: BinDir,
    pub drains: Vec<Drain>,
    pub median_events_per_second: Option<f64>,
    /// The median against the first build's.
    pub ratio_to_first: Option<f64>,
}

/// One timed drain.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    pub round: u32,
    /// Rows in the outbox when the relay started.
    pub backlog: u64,
    pub relayed: u64,
    pub seconds: f64,
    pub events_per_second: f64,
    /// Whether the outbox was empty before the cap.
    pub drained: bool,
}

/// `soldonce bench relay`.
pub async fn run(args: RelayArgs, out: &crate::output::Output) -> Result<ExitCode, CliError> {
    let builds = if args.bin_dirs.is_empty() {
        vec![BinDir::beside_soldonce()?]
    } else {
        args.bin_dirs
            .iter()
            .map(|d| BinDir::check("--bin-dir", d))
            .collect::<Result<Vec<_>, _>>()?
    };
    let progress = Progress::new(out.json);
    let report = super::system::until_interrupted(measure(&args, builds, &progress)).await;
    progress.finish();
    let report = report?;
    out.print(&report, || markdown(&report));
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    args: &RelayArgs,
    builds: Vec<BinDir>,
    progress: &Progress,
) -> Result<RelayReport, CliError> {
    let machine = Machine::describe();
    let spec = Spec {
        bins: builds[0].clone(),
        services: vec!["checkout"],
        later: 1,
        env: vec![("ACCOUNT_RATE_LIMIT".to_owned(), "0".to_owned())],
        pg_settings: vec![],
    };
    progress.phase("starting checkout");
    let mut system = System::start(spec).await?;
    let measured = drains(&mut system, args, &builds, progress).await;
    progress.phase("stopping the system");
    system.stop().await;
    let measured = measured?;
    let first = median(&rates(&measured[0]));
    let builds = builds
        .into_iter()
        .zip(measured)
        .map(|(binaries, drains)| {
            let median_events_per_second = median(&rates(&drains));
            BuildDrains {
                binaries,
                ratio_to_first: median_events_per_second
                    .zip(first)
                    .and_then(|(m, f)| ratio(m, f)),
                median_events_per_second,
                drains,
            }
        })
        .collect();
    Ok(RelayReport {
        machine,
        rows: args.rows,
        rounds: args.rounds,
        left: args.left,
        builds,
    })
}

fn rates(drains: &[Drain]) -> Vec<f64> {
    drains.iter().map(|d| d.events_per_second).collect()
}

async fn drains(
    system: &mut System,
    args: &RelayArgs,
    builds: &[BinDir],
    progress: &Progress,
) -> Result<Vec<Vec<Drain>>, CliError> {
    system.seed_products().await?;
    let mut all = vec![Vec::new(); builds.len()];
    for round in 1..=args.rounds {
        for (i, bins) in builds.iter().enumerate() {
            progress.phase(format!("round {round}: the outbox analyzed nearly empty"));
            analyzed_nearly_empty(system, bins, args.left).await?;
            progress.phase(format!(
                "round {round}: placing {} orders, no relay running",
                thousands(args.rows as i64)
            ));
            place(system, args.rows).await?;
            progress.phase(format!(
                "round {round}: one relay of {} draining",
                bins.path.display()
            ));
            let drain = drain(system, bins, round).await?;
            progress.line(format!(
                "[round {round}] {}: {} of {} rows relayed in {:.1} s: {} events/s",
                bins.path.display(),
                thousands(drain.relayed as i64),
                thousands(drain.backlog as i64),
                drain.seconds,
                thousands(drain.events_per_second.round() as i64)
            ));
            all[i].push(drain);
        }
    }
    Ok(all)
}

/// Empties the order tables, then 8,000 orders placed and relayed,
/// `left` more placed, and the outbox analyzed keeping its pages.
async fn analyzed_nearly_empty(
    system: &mut System,
    bins: &BinDir,
    left: u64,
) -> Result<(), CliError> {
    system.empty_orders().await?;
    place(system, BEFORE_ANALYZE).await?;
    system
        .start_service_of(bins, "outbox-relay", &[("RUST_LOG", "error")])
        .await?;
    system
        .poll(
            "relaying the first 8,000 orders",
            DRAIN_CAP,
            |pool| async move { Ok((store::outbox::backlog(&pool).await?.0 == 0).then_some(())) },
        )
        .await?;
    system.stop_service("outbox-relay").await;
    if left > 0 {
        place(system, left).await?;
    }
    store::bench::analyze_outbox(&system.pool)
        .await
        .context("analyzing the outbox")?;
    Ok(())
}

/// `orders` orders through checkout, spread over the 10,000 bench SKUs.
async fn place(system: &System, orders: u64) -> Result<(), CliError> {
    let drive = Drive::Closed {
        connections: usize::try_from(orders.min(200)).unwrap_or(200),
        requests: orders,
    };
    let report = system.drive(("BENCH", 10_000), drive, false).await?;
    if report.accepted < orders {
        return Err(anyhow::anyhow!(
            "checkout accepted {} of {orders} orders (answers: {:?})",
            report.accepted,
            report.by_status
        )
        .into());
    }
    Ok(())
}

/// One relay of `bins` started over the backlog and timed until the
/// outbox is empty, or for at most [`DRAIN_CAP`].
async fn drain(system: &mut System, bins: &BinDir, round: u32) -> Result<Drain, CliError> {
    let backlog = count(system).await?;
    let started = Instant::now();
    system
        .start_service_of(bins, "outbox-relay", &[("RUST_LOG", "error")])
        .await?;
    let mut left = backlog;
    while left > 0 && started.elapsed() < DRAIN_CAP {
        system.check_alive()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = count(system).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    system.stop_service("outbox-relay").await;
    let relayed = backlog.saturating_sub(left);
    Ok(Drain {
        round,
        backlog,
        relayed,
        seconds,
        events_per_second: relayed as f64 / seconds.max(1e-9),
        drained: left == 0,
    })
}

async fn count(system: &System) -> Result<u64, CliError> {
    let (rows, _) = store::outbox::backlog(&system.pool)
        .await
        .context("counting the outbox")?;
    Ok(u64::try_from(rows).unwrap_or(0))
}

/// The report for people.
pub fn markdown(r: &RelayReport) -> String {
    let mut md = String::from("# soldonce bench relay\n\n");
    let _ = writeln!(md, "- machine: {}", r.machine.line());
    let _ = writeln!(
        md,
        "- per round and build: {} orders placed and relayed, {} more placed, the outbox analyzed (`VACUUM (ANALYZE, TRUNCATE false)`), then a backlog of {} orders placed through checkout and one relay timed until the outbox is empty (at most {} s); {} round(s), builds alternated\n",
        thousands(BEFORE_ANALYZE as i64),
        r.left,
        thousands(r.rows as i64),
        DRAIN_CAP.as_secs(),
        r.rounds
    );
    md.push_str("| build | events/s, median | rounds | / first build |\n|---|---|---|---|\n");
    for b in &r.builds {
        let rounds: Vec<String> = b
            .drains
            .iter()
            .map(|d| {
                let note = if d.drained { "" } else { " (not drained)" };
                format!("{}{note}", thousands(d.events_per_second.round() as i64))
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            b.binaries.describe(),
            b.median_events_per_second.map_or("-".to_owned(), figure),
            rounds.join(", "),
            b.ratio_to_first
                .map_or("-".to_owned(), |x| format!("{x:.2}"))
        );
    }
    md
}
