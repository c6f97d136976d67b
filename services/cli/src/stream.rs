//! `soldonce stream check|repair`: the JetStream stream compared with
//! PostgreSQL's `events` (the authority), and the events it lost
//! republished in order with their own `Nats-Msg-Id` (see `bus::repair`).
//! The relay does the same by itself when it sees the stream go back; these
//! are the by-hand forms, for a loss older than its window.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use bus::repair::{Report, Since};
use clap::{Args, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Name the events the stream lacks (count and first position); exit 1 if any.
    Check(Window),
    /// Republish the events the stream lacks, in order; exit 1 if any could not be.
    Repair(Window),
}

/// Which events to compare (default: every event the stream still keeps).
#[derive(Debug, Args)]
pub struct Window {
    /// Events recorded at or after this time (RFC 3339), or this long ago (e.g. 15m, 2h).
    #[arg(long, conflicts_with = "since_position")]
    since: Option<String>,
    /// Events from this position in `events` on.
    #[arg(long)]
    since_position: Option<i64>,
}

impl Window {
    fn since(&self) -> Result<Since, CliError> {
        if let Some(p) = self.since_position {
            if p < 1 {
                return Err(CliError::Usage(format!(
                    "--since-position {p}: positions start at 1"
                )));
            }
            return Ok(Since::Position(p));
        }
        let Some(text) = self.since.as_deref() else {
            return Ok(Since::All);
        };
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
            return Ok(Since::Time(t.with_timezone(&chrono::Utc)));
        }
        let ago = humantime::parse_duration(text).map_err(|_| {
            CliError::Usage(format!(
                "--since {text:?}: give an RFC 3339 time (2026-12-05T06:00:00Z) or a duration ago (15m)"
            ))
        })?;
        let ago = chrono::TimeDelta::from_std(ago)
            .map_err(|_| CliError::Usage(format!("--since {text:?}: too long ago")))?;
        Ok(Since::Time(chrono::Utc::now() - ago))
    }
}

pub async fn run(cmd: StreamCommand, out: &Output) -> Result<ExitCode, CliError> {
    let (window, dry_run) = match &cmd {
        StreamCommand::Check(w) => (w, true),
        StreamCommand::Repair(w) => (w, false),
    };
    let since = window.since()?;
    let nats_url = platform::config::nats_url().map_err(|e| CliError::Usage(e.to_string()))?;
    let pool = crate::database::pool().await?;
    let js = if dry_run {
        let js = bus::connect(&nats_url)
            .await
            .context("connecting to NATS_URL")?;
        if js.get_stream(bus::STREAM).await.is_err() {
            return Err(anyhow::anyhow!(
                "the {} stream does not exist (soldonce stream repair creates it and republishes every event)",
                bus::STREAM
            )
            .into());
        }
        js
    } else {
        // A stream deleted whole is repaired too: created as the services create it, then refilled.
        let settings =
            bus::StreamSettings::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
        bus::open(&nats_url, &settings).await?
    };
    let report = bus::repair::repair(&pool, &js, since, dry_run)
        .await
        .context("comparing the stream with the database")?;
    out.print(&report, || render(&report, dry_run));
    // A check fails when an event is missing; a repair when one is still not republished.
    let failed = if dry_run {
        report.missing > 0
    } else {
        report.republished < report.missing
    };
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn render(r: &Report, dry_run: bool) -> String {
    let mut t = format!(
        "compared {} events from position {} with {} messages of the stream in {:.2}s",
        r.expected, r.from_position, r.scanned, r.seconds
    );
    match (r.missing, r.first_missing) {
        (0, _) => t.push_str("\nthe stream holds every event that left the outbox"),
        (n, first) => {
            t.push_str(&format!(
                "\nthe stream lacks {n} events; the first at position {}",
                first.unwrap_or_default()
            ));
            if dry_run {
                t.push_str(" (soldonce stream repair republishes them)");
            } else {
                t.push_str(&format!("\nrepublished {}", r.republished));
            }
        }
    }
    t
}

/// The audit's comparison of the stream with `events`, when `NATS_URL` is
/// set: `None` without it (the audit then says the stream was not compared).
/// The stream compared with `events` (all of it, or from `since`), when
/// NATS_URL is set.
pub async fn audit_gap(pool: &sqlx::PgPool, since: Since) -> Result<Option<Report>, CliError> {
    let Ok(nats_url) = std::env::var("NATS_URL") else {
        return Ok(None);
    };
    let js = bus::connect(&nats_url)
        .await
        .context("connecting to NATS_URL")?;
    let report = bus::repair::repair(pool, &js, since, true)
        .await
        .context("comparing the stream with the database")?;
    Ok(Some(report))
}
