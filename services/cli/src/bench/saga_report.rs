//! `bench saga`'s figures and their Markdown: per case the open loop
//! (placement to each milestone, the stages, messages per batch, CPU per
//! order) and the closed loop (accepted and settled orders/s, CPU per
//! order), with the machine and the binaries they were measured on.

use super::bins::BinDir;
use super::case::Case;
use super::cpu::CpuUse;
use super::machine::Machine;
use super::scrape::{Messages, Stage};
use super::stats::{figure, ratio, thousands};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Everything one saga run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SagaReport {
    pub machine: Machine,
    pub binaries: BinDir,
    /// Variables set for every service over the bench's defaults.
    pub env: Vec<String>,
    pub psp_faults: String,
    pub pg_settings: Vec<String>,
    pub seconds: u64,
    /// The open loop's orders per second.
    pub rate: f64,
    /// The closed loop's buyers.
    pub connections: usize,
    pub cases: Vec<CaseReport>,
    /// checkout's webhook answers by outcome, over the run.
    pub webhooks: BTreeMap<String, u64>,
}

/// One case's loops.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub case: Case,
    pub skus: u32,
    /// The same closed loop with checkout alone, when measured.
    pub alone_accepted_per_second: Option<f64>,
    pub open: OpenLoop,
    pub closed: Option<ClosedLoop>,
}

/// Placement (`202`) to a milestone.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Milestone {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub orders: u64,
}

impl From<store::timings::Percentiles> for Milestone {
    fn from(p: store::timings::Percentiles) -> Self {
        Milestone {
            p50_ms: p.p50_ms,
            p99_ms: p.p99_ms,
            orders: u64::try_from(p.orders).unwrap_or(0),
        }
    }
}

/// The open loop: orders on a schedule, then every one followed to its end.
#[derive(Debug, Clone, Serialize)]
pub struct OpenLoop {
    pub requests: u64,
    /// Answered `202`, by the load generator's count.
    pub accepted: u64,
    /// Of those, found in the database.
    pub accepted_in_database: Option<u64>,
    pub by_status: BTreeMap<String, u64>,
    pub http_p50_ms: f64,
    pub http_p99_ms: f64,
    /// Orders in the database after the loop.
    pub orders: u64,
    /// Of those, confirmed.
    pub confirmed: u64,
    /// The warm-up before the loop (2 s at its rate, not counted in the
    /// figures): its `202` → confirmed. The first case's is the system's
    /// first orders since it started.
    pub warm_up: Option<Milestone>,
    pub to_confirmed: Option<Milestone>,
    pub to_delivered: Option<Milestone>,
    pub to_captured: Option<Milestone>,
    pub stages: Vec<Stage>,
    pub messages: Vec<Messages>,
    pub cpu: CpuUse,
}

/// The closed loop: as fast as checkout answers, then until every order
/// settled, and on until every one was delivered and captured (the CPU's
/// window).
#[derive(Debug, Clone, Serialize)]
pub struct ClosedLoop {
    pub requests: u64,
    pub accepted: u64,
    pub accepted_in_database: Option<u64>,
    pub by_status: BTreeMap<String, u64>,
    pub accepted_per_second: f64,
    /// From the first order sent until no order waited for its payment.
    pub settled_seconds: f64,
    /// Accepted orders over `settled_seconds`: orders through the saga per second.
    pub settled_per_second: f64,
    /// From the first order sent until every order was also delivered and
    /// its capture recorded: the window `cpu` is measured over.
    pub finished_seconds: f64,
    pub against_alone: Option<AgainstAlone>,
    pub cpu: CpuUse,
}

/// The closed loop as a share of what checkout accepts alone.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AgainstAlone {
    pub alone_per_second: f64,
    pub accepted: Option<f64>,
    pub settled: Option<f64>,
}

impl OpenLoop {
    /// One line for the progress log.
    pub fn line(&self) -> String {
        let p99 = |m: &Option<Milestone>| m.map_or("-".to_owned(), |m| format!("{:.1}", m.p99_ms));
        format!(
            "{} accepted, {} confirmed; 202 → confirmed p99 {} ms, → delivered p99 {} ms, → captured p99 {} ms; CPU {:.2} ms per order",
            self.accepted,
            self.confirmed,
            p99(&self.to_confirmed),
            p99(&self.to_delivered),
            p99(&self.to_captured),
            self.cpu.ms_per_order
        )
    }
}

impl ClosedLoop {
    /// The figures from the load generator's report and the times until
    /// every order settled and until every one finished (delivered and
    /// captured).
    pub fn new(
        load: crate::load::Report,
        (settled_seconds, finished_seconds): (f64, f64),
        alone: Option<f64>,
        cpu: CpuUse,
    ) -> Self {
        let settled_per_second = load.accepted as f64 / settled_seconds.max(1e-9);
        ClosedLoop {
            requests: load.requests,
            accepted: load.accepted,
            accepted_in_database: load.orders_in_database,
            by_status: load.by_status,
            accepted_per_second: load.accepted_per_second,
            settled_seconds,
            settled_per_second,
            finished_seconds,
            against_alone: alone.map(|a| AgainstAlone {
                alone_per_second: a,
                accepted: ratio(load.accepted_per_second, a),
                settled: ratio(settled_per_second, a),
            }),
            cpu,
        }
    }

    /// One line for the progress log and the report.
    pub fn line(&self) -> String {
        let against = self.against_alone.map_or(String::new(), |a| {
            let r = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}×"));
            format!(
                "; against checkout alone ({}/s): accepted {}, settled {}",
                thousands(a.alone_per_second.round() as i64),
                r(a.accepted),
                r(a.settled)
            )
        });
        format!(
            "{} orders accepted at {}/s; all settled after {:.1} s: {} orders/s through the saga{against}; all delivered and captured after {:.1} s",
            thousands(self.accepted as i64),
            thousands(self.accepted_per_second.round() as i64),
            self.settled_seconds,
            thousands(self.settled_per_second.round() as i64),
            self.finished_seconds
        )
    }
}

/// The report for people.
pub fn markdown(r: &SagaReport) -> String {
    let mut md = String::from("# soldonce bench saga\n\n");
    let env = if r.env.is_empty() {
        "none over the defaults".to_owned()
    } else {
        r.env.join(" ")
    };
    let settings = if r.pg_settings.is_empty() {
        "defaults".to_owned()
    } else {
        r.pg_settings.join(" ")
    };
    let _ = writeln!(md, "- machine: {}", r.machine.line());
    let _ = writeln!(
        md,
        "- services: {}; variables: {env}",
        r.binaries.describe()
    );
    let _ = writeln!(
        md,
        "- PSP faults `{}`; PostgreSQL settings: {settings}; {} s per loop: open loop {} orders/s, closed loop {} connections\n",
        r.psp_faults, r.seconds, r.rate, r.connections
    );
    for case in &r.cases {
        case_markdown(&mut md, r, case);
    }
    if !r.webhooks.is_empty() {
        let outcomes: Vec<String> = r
            .webhooks
            .iter()
            .map(|(k, v)| format!("{k} {}", thousands(*v as i64)))
            .collect();
        let _ = writeln!(
            md,
            "checkout's webhook answers by outcome, over the run: {}",
            outcomes.join(", ")
        );
    }
    md
}

fn case_markdown(md: &mut String, r: &SagaReport, case: &CaseReport) {
    let o = &case.open;
    let what = if case.skus == 1 {
        "one SKU".to_owned()
    } else {
        format!("{} SKUs", thousands(i64::from(case.skus)))
    };
    let _ = writeln!(md, "## {}: {what}\n", case.case.name());
    let _ = writeln!(
        md,
        "Open loop, {} orders/s for {} s: {} of {} requests accepted (HTTP p50 {:.1} ms, p99 {:.1} ms); {} orders, {} confirmed.\n",
        r.rate, r.seconds, thousands(o.accepted as i64), thousands(o.requests as i64), o.http_p50_ms, o.http_p99_ms,
        thousands(o.orders as i64), thousands(o.confirmed as i64)
    );
    md.push_str("| from 202 to | p50 ms | p99 ms | orders |\n|---|---|---|---|\n");
    for (name, m) in [
        ("confirmed", o.to_confirmed),
        ("delivered", o.to_delivered),
        ("captured", o.to_captured),
    ] {
        match m {
            Some(m) => {
                let _ = writeln!(
                    md,
                    "| {name} | {} | {} | {} |",
                    figure(m.p50_ms),
                    figure(m.p99_ms),
                    thousands(m.orders as i64)
                );
            }
            None => {
                let _ = writeln!(md, "| {name} | - | - | 0 |");
            }
        }
    }
    if let Some(w) = o.warm_up {
        let _ = writeln!(
            md,
            "\nBefore it, a warm-up of {} orders at the same rate, not counted above{}: 202 → confirmed p50 {} ms, p99 {} ms.",
            thousands(w.orders as i64),
            if r.cases.first().is_some_and(|c| c.case == case.case) {
                " (the system's first orders since it started)"
            } else {
                ""
            },
            figure(w.p50_ms),
            figure(w.p99_ms)
        );
    }
    stages_markdown(md, o);
    if let Some(c) = &case.closed {
        let statuses: Vec<String> = c
            .by_status
            .iter()
            .map(|(s, n)| format!("{s} {}", thousands(*n as i64)))
            .collect();
        let _ = writeln!(
            md,
            "Closed loop, {} connections, {} requests: {}. Answers: {}.\n",
            r.connections,
            thousands(c.requests as i64),
            c.line(),
            statuses.join(", ")
        );
    }
    cpu_markdown(md, &o.cpu, case.closed.as_ref().map(|c| &c.cpu));
}

/// The stages' table and the consumers' messages per batch.
fn stages_markdown(md: &mut String, o: &OpenLoop) {
    md.push_str(
        "\n| stage (between two scrapes) | p50 ms | p99 ms | observed |\n|---|---|---|---|\n",
    );
    for s in &o.stages {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} |",
            s.stage,
            figure(s.p50_ms),
            figure(s.p99_ms),
            thousands(s.observed as i64)
        );
    }
    let messages: Vec<String> = o
        .messages
        .iter()
        .map(|m| {
            let f = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.1}"));
            format!(
                "{} {} per batch, {} per transaction",
                m.consumer,
                f(m.per_batch),
                f(m.per_transaction)
            )
        })
        .collect();
    let _ = writeln!(md, "\nMessages: {}.\n", messages.join("; "));
}

fn cpu_markdown(md: &mut String, open: &CpuUse, closed: Option<&CpuUse>) {
    let mut programs: Vec<&str> = open.by_program.iter().map(|p| p.program.as_str()).collect();
    for p in closed.iter().flat_map(|c| c.by_program.iter()) {
        if !programs.contains(&p.program.as_str()) {
            programs.push(&p.program);
        }
    }
    let cell = |c: Option<&CpuUse>, f: &dyn Fn(&CpuUse) -> String| c.map_or("-".to_owned(), f);
    md.push_str("| CPU per order, ms | open loop | closed loop |\n|---|---|---|\n");
    let _ = writeln!(
        md,
        "| every program of the system | {:.2} | {} |",
        open.ms_per_order,
        cell(closed, &|c| format!("{:.2}", c.ms_per_order))
    );
    for name in programs {
        let _ = writeln!(
            md,
            "| {name} | {:.2} | {} |",
            open.program(name),
            cell(closed, &|c| format!("{:.2}", c.program(name)))
        );
    }
    let _ = writeln!(
        md,
        "| every process on the machine | {:.2} | {} |",
        open.machine_ms_per_order,
        cell(closed, &|c| format!("{:.2}", c.machine_ms_per_order))
    );
    let _ = writeln!(
        md,
        "| cores busy (every process), over | {:.0}%, {:.1} s | {} |\n",
        100.0 * open.cores_busy,
        open.wall_seconds,
        cell(closed, &|c| format!(
            "{:.0}%, {:.1} s",
            100.0 * c.cores_busy,
            c.wall_seconds
        ))
    );
}
