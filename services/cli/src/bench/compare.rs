//! `soldonce bench compare`: two builds (or one build under two settings)
//! through the same saga, side by side. Each round runs `bench saga`'s
//! loops (no checkout-alone loop) once per side, each on a fresh system,
//! the sides' order alternated from one round to the next; then every
//! figure's median per side with its rounds, and the ratio after/before.
//! On a shared machine one round can differ from the next by 10% or more,
//! every program alike: a change of a few percent shows only in medians of
//! rounds taken in turn. The measuring code is the same for both sides;
//! only the service binaries and their variables differ.

use super::bins::BinDir;
use super::machine::Machine;
use super::progress::Progress;
use super::saga::{self, Plan, SagaOptions};
use super::saga_report::SagaReport;
use super::stats::{figure, median, ratio};
use crate::CliError;
use clap::Args;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// The programs whose CPU per order each side's figures name.
const PROGRAMS: [&str; 7] = [
    "postgres",
    "checkout",
    "payment-worker",
    "outbox-relay",
    "fulfillment",
    "nats-server",
    "psp-sim",
];

/// `bench compare`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The "before" build's directory of service binaries.
    #[arg(long, value_name = "DIR")]
    pub before: PathBuf,
    /// The "after" build's directory (the same directory as --before compares two settings).
    #[arg(long, value_name = "DIR")]
    pub after: PathBuf,
    /// A variable for the before side's services only, NAME=value (repeatable).
    #[arg(long = "before-env", value_name = "NAME=VALUE", value_parser = super::args::env_pair)]
    pub before_env: Vec<(String, String)>,
    /// A variable for the after side's services only, NAME=value (repeatable).
    #[arg(long = "after-env", value_name = "NAME=VALUE", value_parser = super::args::env_pair)]
    pub after_env: Vec<(String, String)>,
    /// Rounds; each runs both sides once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    #[command(flatten)]
    pub options: SagaOptions,
}

/// What the comparison found.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub machine: Machine,
    pub before: Side,
    pub after: Side,
    pub rounds: u32,
    pub figures: Vec<Compared>,
    /// Every saga run, by side, in round order.
    pub runs: Runs,
}

/// One side: its binaries and variables.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub binaries: BinDir,
    pub env: Vec<String>,
}

/// Every saga run of each side.
#[derive(Debug, Clone, Serialize)]
pub struct Runs {
    pub before: Vec<SagaReport>,
    pub after: Vec<SagaReport>,
}

/// One figure on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub case: &'static str,
    pub figure: String,
    pub before: Rounds,
    pub after: Rounds,
    /// after / before, of the medians.
    pub ratio: Option<f64>,
}

/// One side's values of a figure.
#[derive(Debug, Clone, Serialize)]
pub struct Rounds {
    pub median: Option<f64>,
    pub rounds: Vec<f64>,
}

/// `soldonce bench compare`.
pub async fn run(args: CompareArgs, out: &crate::output::Output) -> Result<ExitCode, CliError> {
    let before = BinDir::check("--before", &args.before)?;
    let after = BinDir::check("--after", &args.after)?;
    let plans = [
        Plan::new(&args.options, before, args.before_env.clone(), false)?,
        Plan::new(&args.options, after, args.after_env.clone(), false)?,
    ];
    let progress = Progress::new(out.json);
    let report = super::system::until_interrupted(compare(&plans, args.rounds, &progress)).await;
    progress.finish();
    let report = report?;
    out.print(&report, || markdown(&report));
    Ok(ExitCode::SUCCESS)
}

async fn compare(
    plans: &[Plan; 2],
    rounds: u32,
    progress: &Progress,
) -> Result<CompareReport, CliError> {
    let machine = Machine::describe();
    let names = ["before", "after"];
    let mut runs: [Vec<SagaReport>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        // Odd rounds run before first, even rounds after first.
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for side in order {
            progress.phase(format!("round {round} of {rounds}: {}", names[side]));
            let report = saga::measure(&plans[side], progress).await?;
            progress.line(format!(
                "round {round} {}: {}",
                names[side],
                summary(&report)
            ));
            runs[side].push(report);
        }
    }
    let figures = compared(&runs[0], &runs[1]);
    let side = |plan: &Plan| Side {
        binaries: plan.bins.clone(),
        env: plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
    };
    let [before, after] = runs;
    Ok(CompareReport {
        machine,
        before: side(&plans[0]),
        after: side(&plans[1]),
        rounds,
        figures,
        runs: Runs { before, after },
    })
}

/// A round's headline: each case's settled orders/s, or its confirmed p99.
fn summary(report: &SagaReport) -> String {
    let parts: Vec<String> = report
        .cases
        .iter()
        .map(|c| match &c.closed {
            Some(closed) => format!(
                "{} settled {:.0}/s",
                c.case.name(),
                closed.settled_per_second
            ),
            None => format!(
                "{} 202 → confirmed p99 {} ms",
                c.case.name(),
                c.open
                    .to_confirmed
                    .map_or("-".to_owned(), |m| format!("{:.1}", m.p99_ms))
            ),
        })
        .collect();
    parts.join(", ")
}

/// The figures one saga run yields, in report order: (case, figure, value).
fn figures(report: &SagaReport) -> Vec<(&'static str, String, f64)> {
    let mut out = Vec::new();
    for c in &report.cases {
        let case = c.case.name();
        let mut add = |name: &str, value: Option<f64>| {
            if let Some(v) = value {
                out.push((case, name.to_owned(), v));
            }
        };
        let o = &c.open;
        add(
            "open: 202 → confirmed p99 (ms)",
            o.to_confirmed.map(|m| m.p99_ms),
        );
        add(
            "open: warm-up 202 → confirmed p99 (ms)",
            o.warm_up.map(|m| m.p99_ms),
        );
        add(
            "open: 202 → delivered p99 (ms)",
            o.to_delivered.map(|m| m.p99_ms),
        );
        add(
            "open: 202 → captured p99 (ms)",
            o.to_captured.map(|m| m.p99_ms),
        );
        let puback = o
            .stages
            .iter()
            .find(|s| s.stage == "outbox_commit_to_puback");
        add("open: commit → PubAck p99 (ms)", puback.map(|s| s.p99_ms));
        add(
            "open: CPU per order, every program (ms)",
            Some(o.cpu.ms_per_order),
        );
        for p in PROGRAMS {
            add(
                &format!("open: CPU per order, {p} (ms)"),
                Some(o.cpu.program(p)),
            );
        }
        if let Some(k) = &c.closed {
            add("closed: accepted orders/s", Some(k.accepted_per_second));
            add("closed: settled orders/s", Some(k.settled_per_second));
            add(
                "closed: every order delivered and captured after (s)",
                Some(k.finished_seconds),
            );
            add(
                "closed: CPU per order, every program (ms)",
                Some(k.cpu.ms_per_order),
            );
            for p in PROGRAMS {
                add(
                    &format!("closed: CPU per order, {p} (ms)"),
                    Some(k.cpu.program(p)),
                );
            }
        }
    }
    out
}

/// Each figure's rounds and median on both sides, in first-seen order.
fn compared(before: &[SagaReport], after: &[SagaReport]) -> Vec<Compared> {
    let mut keys: Vec<(&'static str, String)> = Vec::new();
    let mut values: std::collections::HashMap<(&'static str, String), [Vec<f64>; 2]> =
        Default::default();
    for (side, runs) in [before, after].into_iter().enumerate() {
        for (case, name, value) in runs.iter().flat_map(figures) {
            let key = (case, name);
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
            values.entry(key).or_default()[side].push(value);
        }
    }
    keys.into_iter()
        .map(|key| {
            let [b, a] = values.remove(&key).unwrap_or_default();
            let (mb, ma) = (median(&b), median(&a));
            Compared {
                case: key.0,
                figure: key.1,
                ratio: ma.zip(mb).and_then(|(a, b)| ratio(a, b)),
                before: Rounds {
                    median: mb,
                    rounds: b,
                },
                after: Rounds {
                    median: ma,
                    rounds: a,
                },
            }
        })
        .collect()
}

/// The report for people: one table of medians, rounds and ratios.
pub fn markdown(r: &CompareReport) -> String {
    let mut md = String::from("# soldonce bench compare\n\n");
    let env = |s: &Side| {
        if s.env.is_empty() {
            String::new()
        } else {
            format!(", variables {}", s.env.join(" "))
        }
    };
    let _ = writeln!(md, "- machine: {}", r.machine.line());
    let _ = writeln!(
        md,
        "- before: {}{}",
        r.before.binaries.describe(),
        env(&r.before)
    );
    let _ = writeln!(
        md,
        "- after: {}{}",
        r.after.binaries.describe(),
        env(&r.after)
    );
    if let Some(run) = r.runs.before.first() {
        let _ = writeln!(
            md,
            "- `bench saga` per side and round, each on a fresh system: PSP faults `{}`, {} s per loop; {} round(s), the sides' order alternated",
            run.psp_faults, run.seconds, r.rounds
        );
    }
    md.push_str("\n| case | figure | before: median (rounds) | after: median (rounds) | after / before |\n|---|---|---|---|---|\n");
    for f in &r.figures {
        let side = |s: &Rounds| {
            let rounds: Vec<String> = s.rounds.iter().map(|v| figure(*v)).collect();
            format!(
                "{} ({})",
                s.median.map_or("-".to_owned(), figure),
                rounds.join(", ")
            )
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            f.case,
            f.figure,
            side(&f.before),
            side(&f.after),
            f.ratio.map_or("-".to_owned(), |x| format!("{x:.2}"))
        );
    }
    md
}
