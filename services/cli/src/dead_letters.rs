//! `soldonce dead-letters list|redrive`: the messages consumers gave up
//! on, and sending them again, once the cause is fixed, to the consumer
//! that gave up on each (see `bus::redrive` for how, and why it is safe to
//! run twice and beside the consumers).

use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;
use std::process::ExitCode;
use store::dead_letters::{Letter, Selection};

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// The dead letters not yet redriven, newest first.
    List {
        /// Only this consumer's (its durable name, e.g. payment-worker).
        #[arg(long)]
        consumer: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
        /// Include letters already redriven.
        #[arg(long)]
        include_redriven: bool,
    },
    /// Send dead letters again to the consumer that gave up on each (reads
    /// NATS_URL): fix the cause first. A letter is redriven once; a message
    /// that fails again becomes a new letter.
    Redrive(RedriveArgs),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).multiple(false))]
pub struct RedriveArgs {
    /// These letters (`--id 3 --id 4` or `--id 3,4`).
    #[arg(long = "id", group = "which", value_delimiter = ',', num_args = 1..,
          value_parser = clap::value_parser!(i64).range(1..))]
    ids: Vec<i64>,
    /// Every letter of this consumer.
    #[arg(long, group = "which")]
    consumer: Option<String>,
    /// Every letter.
    #[arg(long, group = "which")]
    all: bool,
    /// Say what would be sent; send nothing.
    #[arg(long)]
    dry_run: bool,
}

/// A letter as shown: its row, and what its message says about itself.
#[derive(Debug, Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    letter: &'a Letter,
    /// The subject it was first published on.
    original_subject: String,
    /// The event's id and type, when the message is a readable envelope.
    event_id: Option<String>,
    event_type: Option<String>,
    payload_bytes: usize,
    /// The message as text, when it is UTF-8.
    payload: Option<&'a str>,
}

fn shown(letter: &Letter) -> Shown<'_> {
    let envelope: Option<serde_json::Value> = serde_json::from_slice(&letter.payload).ok();
    let field = |name: &str| {
        envelope
            .as_ref()
            .and_then(|e| e[name].as_str())
            .map(str::to_owned)
    };
    Shown {
        letter,
        original_subject: events::names::original_subject(&letter.subject),
        event_id: field("id"),
        event_type: field("type"),
        payload_bytes: letter.payload.len(),
        payload: std::str::from_utf8(&letter.payload).ok(),
    }
}

pub async fn run(cmd: DeadLettersCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        DeadLettersCommand::List {
            consumer,
            limit,
            include_redriven,
        } => list(consumer.as_deref(), limit, include_redriven, out).await,
        DeadLettersCommand::Redrive(args) => redrive(args, out).await,
    }
}

async fn list(
    consumer: Option<&str>,
    limit: i64,
    include_redriven: bool,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let letters = store::dead_letters::list(&pool().await?, consumer, include_redriven, limit)
        .await
        .context("reading the dead letters")?;
    let rows: Vec<Shown> = letters.iter().map(shown).collect();
    out.print(&rows, || {
        let mut t = String::new();
        for r in &rows {
            let l = r.letter;
            t.push_str(&format!(
                "#{} {} at {} (stream sequence {}) {}: {}\n    event {} {} on {}{}\n",
                l.id,
                l.consumer,
                l.created_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                l.stream_seq.unwrap_or_default(),
                if l.redriven_at.is_some() { "redriven" } else { "outstanding" },
                l.reason,
                r.event_id.as_deref().unwrap_or("?"),
                r.event_type.as_deref().unwrap_or("(not a readable envelope)"),
                r.original_subject,
                l.redriven_at
                    .map(|at| format!(", redriven at {}", at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
                    .unwrap_or_default(),
            ));
        }
        t.push_str(&format!(
            "{} dead letters{}",
            rows.len(),
            if rows.is_empty() {
                ""
            } else {
                " (once the cause is fixed: soldonce dead-letters redrive --id N | --consumer C | --all)"
            }
        ));
        t
    });
    Ok(ExitCode::SUCCESS)
}

/// A letter asked for by id that was redriven before.
#[derive(Debug, Serialize)]
struct Already {
    id: i64,
    redriven_at: chrono::DateTime<chrono::Utc>,
}

async fn redrive(args: RedriveArgs, out: &Output) -> Result<ExitCode, CliError> {
    let pool = pool().await?;
    let (selection, already) = select(&pool, &args).await?;
    let report = if args.dry_run {
        bus::redrive::plan(&pool, &selection).await?
    } else {
        let url = platform::config::nats_url().map_err(|e| CliError::Usage(e.to_string()))?;
        let js = bus::connect(&url).await.context("connecting to NATS_URL")?;
        bus::redrive::redrive(&pool, &js, &selection).await?
    };
    let value = serde_json::json!({ "report": report, "already_redriven": already });
    out.print(&value, || {
        let verb = if report.dry_run {
            "would redrive"
        } else {
            "redrove"
        };
        let mut t = String::new();
        for r in &report.redriven {
            t.push_str(&format!(
                "{verb} #{} to {} on {}",
                r.id, r.consumer, r.subject
            ));
            if !report.dry_run {
                t.push_str(&format!(" (stream sequence {})", r.stream_seq));
            }
            t.push('\n');
        }
        for a in &already {
            t.push_str(&format!(
                "#{} was redriven already, at {}\n",
                a.id,
                a.redriven_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        for r in &report.refused {
            t.push_str(&format!("cannot redrive #{}: {}\n", r.id, r.why));
        }
        t.push_str(&format!("{verb} {} dead letters", report.redriven.len()));
        t
    });
    Ok(if report.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The selection the arguments name, checked before anything is sent:
/// an id or consumer that never had a dead letter is bad input. Also the
/// letters asked for by id that were redriven already.
async fn select(
    pool: &sqlx::PgPool,
    args: &RedriveArgs,
) -> Result<(Selection, Vec<Already>), CliError> {
    if let Some(consumer) = &args.consumer {
        let known = store::dead_letters::consumers(pool)
            .await
            .context("reading the dead letters")?;
        if !known.contains(consumer) {
            return Err(CliError::Usage(format!(
                "--consumer {consumer}: no dead letters of that consumer (consumers with dead letters: {})",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        }
        return Ok((Selection::Consumer(consumer.clone()), vec![]));
    }
    if args.all {
        return Ok((Selection::All, vec![]));
    }
    let mut ids = args.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let found = store::dead_letters::find(pool, &ids)
        .await
        .context("reading the dead letters")?;
    let unknown: Vec<String> = ids
        .iter()
        .filter(|id| !found.iter().any(|l| l.id == **id))
        .map(i64::to_string)
        .collect();
    if !unknown.is_empty() {
        return Err(CliError::Usage(format!(
            "--id: no dead letter {} (soldonce dead-letters list --include-redriven shows them)",
            unknown.join(", ")
        )));
    }
    let already = found
        .iter()
        .filter_map(|l| {
            l.redriven_at.map(|redriven_at| Already {
                id: l.id,
                redriven_at,
            })
        })
        .collect();
    Ok((Selection::Ids(ids), already))
}
