//! `soldonce outbox parked|requeue`: the events the relay set aside as
//! never publishable, and putting them back in the outbox once the cause is
//! fixed. A requeue is one statement (the rows leave `outbox_parked` and
//! enter `outbox` together, each at its old position, so it leaves before
//! any later event of its order still waiting); a row already requeued is
//! not there to requeue again.

use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::{Args, Subcommand};
use std::process::ExitCode;
use uuid::Uuid;

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// The events the relay parked, oldest first, with the reason.
    Parked {
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
    },
    /// Put parked events back in the outbox, so the relay publishes them:
    /// fix the cause first (a parked row that still fails is parked again).
    Requeue(RequeueArgs),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).multiple(false))]
pub struct RequeueArgs {
    /// These events, by event id (`--id A --id B` or `--id A,B`).
    #[arg(long = "id", group = "which", value_delimiter = ',', num_args = 1..)]
    ids: Vec<Uuid>,
    /// Every parked event.
    #[arg(long, group = "which")]
    all: bool,
    /// Say what would be requeued; change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(cmd: OutboxCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        OutboxCommand::Parked { limit } => parked(limit, out).await,
        OutboxCommand::Requeue(args) => requeue(args, out).await,
    }
}

async fn parked(limit: i64, out: &Output) -> Result<ExitCode, CliError> {
    let rows = store::outbox::parked_rows(&pool().await?, limit)
        .await
        .context("reading outbox_parked")?;
    out.print(&rows, || {
        let mut t = String::new();
        for r in &rows {
            t.push_str(&format!(
                "event {} of {} on {}: {} ({} bytes), parked at {}\n",
                r.id,
                r.stream_id,
                r.subject,
                r.reason,
                r.bytes,
                r.parked_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        t.push_str(&format!("{} parked events", rows.len()));
        if !rows.is_empty() {
            t.push_str(" (once the cause is fixed: soldonce outbox requeue --id EVENT_ID | --all)");
        }
        t
    });
    Ok(ExitCode::SUCCESS)
}

async fn requeue(args: RequeueArgs, out: &Output) -> Result<ExitCode, CliError> {
    let pool = pool().await?;
    let (wanted, not_parked) = if args.all {
        (None, vec![])
    } else {
        let mut ids = args.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        let (parked, known) = store::outbox::classify_ids(&pool, &ids)
            .await
            .context("reading outbox_parked")?;
        let unknown: Vec<String> = ids
            .iter()
            .filter(|id| !parked.contains(id) && !known.contains(id))
            .map(Uuid::to_string)
            .collect();
        if !unknown.is_empty() {
            return Err(CliError::Usage(format!(
                "--id: no event {} (soldonce outbox parked lists the parked ones)",
                unknown.join(", ")
            )));
        }
        (Some(parked), known)
    };
    let store::outbox::Requeued { moved, no_event } = match &wanted {
        Some(ids) if ids.is_empty() => Default::default(),
        _ => store::outbox::requeue(&pool, wanted.as_deref(), args.dry_run)
            .await
            .context("moving the rows back into the outbox")?,
    };
    // Asked for and parked when looked at, but moved meanwhile by another requeue.
    let mut not_parked = not_parked;
    if let Some(ids) = &wanted {
        not_parked.extend(
            ids.iter()
                .filter(|id| !moved.contains(id) && !no_event.contains(id)),
        );
    }
    let value = serde_json::json!({
        "dry_run": args.dry_run,
        "requeued": moved,
        "not_parked": not_parked,
        "no_event": no_event,
    });
    out.print(&value, || {
        let verb = if args.dry_run {
            "would requeue"
        } else {
            "requeued"
        };
        let mut t = String::new();
        for id in &moved {
            t.push_str(&format!("{verb} event {id}\n"));
        }
        for id in &not_parked {
            t.push_str(&format!(
                "event {id} is not parked (requeued already, or never parked)\n"
            ));
        }
        for id in &no_event {
            t.push_str(&format!(
                "parked row {id} names no event in the store, so there is nothing to publish it from: it stays parked\n"
            ));
        }
        t.push_str(&format!("{verb} {} events", moved.len()));
        if !args.dry_run && !moved.is_empty() {
            t.push_str(": the relay publishes them");
        }
        t
    });
    Ok(ExitCode::SUCCESS)
}
