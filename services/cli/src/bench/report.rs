//! The bench's figures, the machine they were measured on, and the files
//! they are written to: report.md, report.json and throughput.svg.

use super::sql::ServerFacts;
use super::target::Counted;
use super::workload::{Answers, Throughput};
use super::{FlashSaleArgs, Strategy};
use crate::CliError;
use anyhow::Context;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Everything the bench measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    /// The bench's own database.
    pub database: String,
    pub database_dropped: bool,
    pub settings: Settings,
    pub strategies: Vec<StrategyReport>,
}

/// Where the figures come from.
#[derive(Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: String,
    pub fsync: String,
    pub synchronous_commit: String,
    /// `debug` or `release`: a debug build's figures say little.
    pub build: &'static str,
    pub date: String,
}

impl Machine {
    /// This machine, and the server as it describes itself.
    pub fn describe(server: &ServerFacts) -> Machine {
        Machine {
            cores: platform::runtime::cores(),
            memory_gib: super::machine::memory_gib(),
            kernel: super::machine::kernel(),
            postgres: server.version.clone(),
            fsync: server.fsync.clone(),
            synchronous_commit: server.synchronous_commit.clone(),
            build: super::machine::build(),
            date: super::machine::now(),
        }
    }
}

/// The knobs the bench ran with.
#[derive(Debug, Serialize)]
pub struct Settings {
    pub runs: u32,
    pub buyers: usize,
    pub seconds: f64,
    pub connections: usize,
    pub skus: u32,
    pub pool: u32,
    pub checkout_pool: u32,
}

impl From<&FlashSaleArgs> for Settings {
    fn from(a: &FlashSaleArgs) -> Settings {
        Settings {
            runs: a.runs,
            buyers: a.buyers,
            seconds: a.seconds,
            connections: a.connections,
            skus: a.skus,
            pool: a.pool,
            checkout_pool: a.checkout_pool,
        }
    }
}

/// One sellout run: buyers raced for one unit.
#[derive(Debug, Serialize)]
pub struct SelloutRun {
    pub run: u32,
    pub sku: String,
    /// Units sold as the answers tell it (one unit an order).
    pub sold_by_answers: u64,
    /// Units sold as the database tells it.
    pub sold_in_database: i64,
    pub available_after: i64,
    pub answers: Answers,
    /// The two counts disagree.
    pub mismatch: bool,
}

impl SelloutRun {
    /// A run's figures from its answers and the database's count.
    pub fn new(run: u32, sku: String, answers: Answers, counted: Counted) -> SelloutRun {
        SelloutRun {
            run,
            sku,
            sold_by_answers: answers.accepted,
            sold_in_database: counted.units,
            available_after: counted.available_after,
            mismatch: i64::try_from(answers.accepted).ok() != Some(counted.units),
            answers,
        }
    }

    fn oversold(&self) -> bool {
        self.sold_in_database > 1 || self.sold_by_answers > 1
    }
}

/// One strategy's figures.
#[derive(Debug, Serialize)]
pub struct StrategyReport {
    pub strategy: Strategy,
    pub units_sold_min: i64,
    pub units_sold_max: i64,
    pub oversold_runs: usize,
    pub mismatched_runs: usize,
    pub sellout: Vec<SelloutRun>,
    pub hot: Throughput,
    pub many: Throughput,
}

impl StrategyReport {
    /// Sums up the sellout runs beside the throughput cases.
    pub fn new(
        strategy: Strategy,
        sellout: Vec<SelloutRun>,
        hot: Throughput,
        many: Throughput,
    ) -> StrategyReport {
        let sold = sellout.iter().map(|r| r.sold_in_database);
        StrategyReport {
            strategy,
            units_sold_min: sold.clone().min().unwrap_or(0),
            units_sold_max: sold.max().unwrap_or(0),
            oversold_runs: sellout.iter().filter(|r| r.oversold()).count(),
            mismatched_runs: sellout.iter().filter(|r| r.mismatch).count(),
            sellout,
            hot,
            many,
        }
    }
}

impl Report {
    /// What should not have happened: an oversell by a strategy that must
    /// not oversell, a run that sold nothing, answers the database contradicts.
    pub fn troubles(&self) -> Vec<String> {
        let mut troubles = vec![];
        for s in &self.strategies {
            let name = s.strategy.name();
            if s.oversold_runs > 0 && !s.strategy.may_oversell() {
                troubles.push(format!(
                    "{name} oversold in {} sellout run(s)",
                    s.oversold_runs
                ));
            }
            if s.mismatched_runs > 0 {
                troubles.push(format!(
                    "{name}: the answers and the database disagree in {} sellout run(s)",
                    s.mismatched_runs
                ));
            }
            let unsold = s.sellout.iter().filter(|r| r.sold_in_database == 0).count();
            if unsold > 0 {
                troubles.push(format!("{name} sold nothing in {unsold} sellout run(s)"));
            }
        }
        troubles
    }
}

/// The report for people: a header naming the machine, and the table.
pub fn markdown(r: &Report) -> String {
    let m = &r.machine;
    let s = &r.settings;
    let mut text = String::from("# Flash-sale write strategies\n\n");
    let _ = writeln!(
        text,
        "Machine: {} cores, {:.1} GiB memory, {}; {} (fsync {}, synchronous_commit {}); {} build; {}.\n",
        m.cores, m.memory_gib, m.kernel, m.postgres, m.fsync, m.synchronous_commit, m.build, m.date
    );
    let _ = writeln!(
        text,
        "Sellout: {} buyers race for 1 unit, {} runs. Throughput: {} connections in a closed loop for {} s a case. \
         SQL strategies share a pool of {}; checkout's pool is {}.\n",
        s.buyers, s.runs, s.connections, s.seconds, s.pool, s.checkout_pool
    );
    let _ = writeln!(
        text,
        "| strategy | units sold per run (min–max, over {} runs) | oversold runs | hot SKU orders/s, p50, p99 | {} SKUs orders/s, p50, p99 |",
        s.runs,
        s.skus
    );
    text.push_str("|---|---|---|---|---|\n");
    for st in &r.strategies {
        let mut sold = format!("{}–{}", st.units_sold_min, st.units_sold_max);
        if st.mismatched_runs > 0 {
            let _ = write!(sold, " ⚠ answers ≠ database in {} runs", st.mismatched_runs);
        }
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} |",
            st.strategy.name(),
            sold,
            st.oversold_runs,
            throughput_cell(&st.hot),
            throughput_cell(&st.many)
        );
    }
    let failures: Vec<String> = r
        .strategies
        .iter()
        .flat_map(|st| {
            let sellout_failed: u64 = st.sellout.iter().map(|run| run.answers.failed).sum();
            let first = st
                .sellout
                .iter()
                .find_map(|run| run.answers.first_failure.clone())
                .or_else(|| st.hot.answers.first_failure.clone())
                .or_else(|| st.many.answers.first_failure.clone());
            let failed = sellout_failed + st.hot.answers.failed + st.many.answers.failed;
            (failed > 0).then(|| {
                format!(
                    "- {}: {failed} requests failed (first: {})",
                    st.strategy.name(),
                    first.unwrap_or_default()
                )
            })
        })
        .collect();
    text.push_str(
        "\nUnits sold are counted in the database (order rows; soldonce's reserved plus sold) \
         and checked against the accepted answers. Latency is every request's, send to answer.\n",
    );
    if !failures.is_empty() {
        text.push_str("\nFailed requests:\n");
        text.push_str(&failures.join("\n"));
        text.push('\n');
    }
    text
}

fn throughput_cell(t: &Throughput) -> String {
    format!(
        "{:.0}/s, {:.1} ms, {:.1} ms",
        t.orders_per_second, t.p50_ms, t.p99_ms
    )
}

/// Writes report.md, report.json and throughput.svg into `dir`.
pub fn write_files(r: &Report, dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(r).context("report as JSON")?;
    let bars: Vec<super::chart::Bars> = r
        .strategies
        .iter()
        .map(|s| super::chart::Bars {
            label: s.strategy.name().to_owned(),
            hot: s.hot.orders_per_second,
            many: s.many.orders_per_second,
        })
        .collect();
    let many_label = format!("{} SKUs", r.settings.skus);
    let svg = super::chart::throughput_svg(&bars, &many_label)?;
    for (name, contents) in [
        ("report.md", markdown(r)),
        ("report.json", json),
        ("throughput.svg", svg),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
