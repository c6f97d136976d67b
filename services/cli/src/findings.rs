//! `soldonce findings list|ack`: what soldonce names to a person (a dispute:
//! answer it at the PSP). A finding stays in the audit until acknowledged.
//! Acknowledging does not release a shipment a dispute held: shipping
//! disputed goods is a decision, taken with `--release` (or never).

use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;
use store::findings::{Acked, Finding};

#[derive(Debug, Subcommand)]
pub enum FindingsCommand {
    /// The findings not acknowledged yet, oldest first.
    List {
        /// Include those acknowledged already.
        #[arg(long)]
        all: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
    },
    /// Acknowledge a finding: the audit stops reporting it. A shipment its
    /// dispute held stays held unless --release is given (also accepted on a
    /// finding acknowledged before). Acknowledging twice with nothing to
    /// release changes nothing and exits 2.
    Ack {
        /// The finding's id (from `soldonce findings list`).
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        id: i64,
        /// Who acknowledges it (recorded).
        #[arg(long, value_parser = name)]
        by: String,
        /// What was decided, e.g. "evidence sent at the PSP" (recorded).
        #[arg(long, value_parser = note)]
        note: Option<String>,
        /// Also release the hold on the order's shipment: fulfillment then ships it.
        #[arg(long)]
        release: bool,
    },
}

fn name(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > 100 || text.chars().any(char::is_control) {
        return Err("--by must be 1 to 100 printable characters".into());
    }
    Ok(text.to_owned())
}

fn note(text: &str) -> Result<String, String> {
    if text.chars().count() > 1000 {
        return Err("--note must be at most 1000 characters".into());
    }
    Ok(text.to_owned())
}

pub async fn run(cmd: FindingsCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        FindingsCommand::List { all, limit } => list(all, limit, out).await,
        FindingsCommand::Ack {
            id,
            by,
            note,
            release,
        } => ack(id, &by, note.as_deref(), release, out).await,
    }
}

fn line(f: &Finding) -> String {
    let order = f
        .order_id
        .map(|o| format!(" order {o}"))
        .unwrap_or_default();
    let state = match (&f.acknowledged_at, &f.acknowledged_by) {
        (Some(at), Some(by)) => format!(
            "acknowledged by {by} at {}{}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            f.note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        ),
        _ => "open".into(),
    };
    format!(
        "#{} {} {}{} at {} ({state}{})\n    {}\n",
        f.id,
        f.kind,
        f.subject,
        order,
        f.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        if f.shipment_held {
            ", shipment held"
        } else {
            ""
        },
        f.detail
    )
}

async fn list(all: bool, limit: i64, out: &Output) -> Result<ExitCode, CliError> {
    let found = store::findings::list(&pool().await?, all, limit)
        .await
        .context("reading the findings")?;
    out.print(&found, || {
        let mut t: String = found.iter().map(line).collect();
        t.push_str(&format!(
            "{} findings{}",
            found.len(),
            if all { "" } else { " open" }
        ));
        t
    });
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct AckShown<'a> {
    finding: &'a Finding,
    released: bool,
}

async fn ack(
    id: i64,
    by: &str,
    note: Option<&str>,
    release: bool,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let acked = store::findings::acknowledge(&pool().await?, id, by, note, release)
        .await
        .context("acknowledging the finding")?;
    match acked {
        Acked::NotFound => Err(CliError::Usage(format!("no finding {id}"))),
        Acked::Already(f) => Err(CliError::Usage(format!(
            "finding {id} was acknowledged already by {} at {}; nothing changed",
            f.acknowledged_by.as_deref().unwrap_or("?"),
            f.acknowledged_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default()
        ))),
        Acked::Done { finding, released } => {
            let shown = AckShown {
                finding: &finding,
                released,
            };
            out.print(&shown, || {
                let hold = match (released, finding.shipment_held) {
                    (true, _) => "; its shipment's hold is released",
                    (false, true) => "; its shipment stays held (--release releases it)",
                    (false, false) => "",
                };
                format!("finding {id} acknowledged by {by}{hold}")
            });
            Ok(ExitCode::SUCCESS)
        }
    }
}
