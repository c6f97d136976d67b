//! Migrations, stock, accounts, projections and the audit.

use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Subcommand;
use domain::Sku;
use std::process::ExitCode;
use store::catalog::{CatalogError, StockRow};

#[derive(Debug, Subcommand)]
pub enum StockCommand {
    /// Goods in: add units to `available` (a `receive` ledger entry).
    Receive {
        #[arg(long)]
        sku: String,
        #[arg(long)]
        quantity: i64,
    },
    /// Correct `available` by a signed delta (an `adjust` ledger entry with its reason).
    Adjust {
        #[arg(long)]
        sku: String,
        #[arg(long, allow_hyphen_values = true)]
        delta: i64,
        #[arg(long)]
        reason: String,
    },
    /// Show the available, reserved and sold buckets.
    Show {
        #[arg(long)]
        sku: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsCommand {
    /// Make the orders (with their lines) and shipments projections the fold
    /// of their events, in short transactions of --batch-size streams beside
    /// live traffic: only rows that differ are written, and checkout keeps
    /// placing orders meanwhile.
    Rebuild {
        /// Streams (orders, then shipments) folded and compared per transaction.
        #[arg(long, default_value_t = store::rebuild::DEFAULT_BATCH,
              value_parser = clap::value_parser!(i64).range(1..=100_000))]
        batch_size: i64,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Create an account; prints its id and its API token (shown once).
    Add {
        #[arg(long)]
        name: String,
    },
    /// Revoke every token of an account: every running checkout refuses
    /// them (401) within 5 seconds.
    Revoke {
        /// The account's id.
        account: String,
    },
    /// Replace every token of an account with a fresh one (printed once, as
    /// JSON); the old ones stop working as with revoke.
    Rotate {
        /// The account's id.
        account: String,
    },
}

pub(crate) fn sku(s: &str) -> Result<Sku, CliError> {
    Sku::parse(s).map_err(|e| CliError::Usage(format!("--sku {s:?}: {e}")))
}

pub(crate) fn catalog_error(e: CatalogError) -> CliError {
    match e {
        CatalogError::Store(s) => CliError::Failed(s.into()),
        other => CliError::Usage(other.to_string()),
    }
}

pub async fn migrate(out: &Output) -> Result<ExitCode, CliError> {
    let pool = pool().await?;
    store::migrate(&pool).await.context("applying migrations")?;
    out.print(&serde_json::json!({ "migrated": true }), || {
        "migrations applied".into()
    });
    Ok(ExitCode::SUCCESS)
}

pub async fn stock(cmd: StockCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        StockCommand::Receive { sku: s, quantity } => {
            let sku = sku(&s)?;
            if quantity <= 0 {
                return Err(CliError::Usage("--quantity must be at least 1".into()));
            }
            let row = store::catalog::receive(&pool().await?, &sku, quantity)
                .await
                .map_err(catalog_error)?;
            print_rows(out, &[row], false);
        }
        StockCommand::Adjust {
            sku: s,
            delta,
            reason,
        } => {
            let sku = sku(&s)?;
            if delta == 0 || reason.trim().is_empty() {
                return Err(CliError::Usage(
                    "--delta must not be 0 and --reason must not be empty".into(),
                ));
            }
            let row = store::catalog::adjust(&pool().await?, &sku, delta, &reason)
                .await
                .map_err(catalog_error)?;
            print_rows(out, &[row], false);
        }
        StockCommand::Show { sku: s } => {
            let sku = s.as_deref().map(sku).transpose()?;
            let rows = store::catalog::show(&pool().await?, sku.as_ref())
                .await
                .context("reading stock")?;
            if let Some(sku) = &sku {
                if rows.is_empty() {
                    return Err(CliError::Usage(format!("unknown sku {sku}")));
                }
            }
            print_rows(out, &rows, sku.is_none());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_rows(out: &Output, rows: &[StockRow], as_list: bool) {
    let text = || {
        let mut t = format!(
            "{:<24} {:>12} {:>12} {:>12}",
            "SKU", "AVAILABLE", "RESERVED", "SOLD"
        );
        for r in rows {
            t.push_str(&format!(
                "\n{:<24} {:>12} {:>12} {:>12}",
                r.sku, r.available, r.reserved, r.sold
            ));
        }
        t
    };
    match (as_list, rows.first()) {
        (false, Some(row)) => out.print(row, text),
        _ => out.print(&rows, text),
    }
}

pub async fn account(cmd: AccountCommand, _out: &Output) -> Result<ExitCode, CliError> {
    let account_id = |raw: &str| {
        uuid::Uuid::parse_str(raw)
            .map_err(|_| CliError::Usage(format!("{raw:?} is not an account id (a UUID)")))
    };
    let unknown = |id: uuid::Uuid| CliError::Usage(format!("no account {id}"));
    let name = match cmd {
        AccountCommand::Add { name } => name,
        AccountCommand::Revoke { account } => {
            let id = account_id(&account)?;
            let revoked = store::accounts::revoke(&pool().await?, id)
                .await
                .context("revoking the tokens")?
                .ok_or_else(|| unknown(id))?;
            println!(
                "{}",
                serde_json::json!({ "account_id": id, "tokens_revoked": revoked })
            );
            return Ok(ExitCode::SUCCESS);
        }
        AccountCommand::Rotate { account } => {
            let id = account_id(&account)?;
            let rotated = store::accounts::rotate(&pool().await?, id)
                .await
                .context("rotating the token")?
                .ok_or_else(|| unknown(id))?;
            println!("{}", serde_json::to_string(&rotated).unwrap_or_default());
            return Ok(ExitCode::SUCCESS);
        }
    };
    if name.trim().is_empty() || name.chars().count() > 200 {
        return Err(CliError::Usage("--name must be 1-200 characters".into()));
    }
    let account = store::accounts::create(&pool().await?, &name)
        .await
        .context("creating the account")?;
    // Always JSON: the token is meant to be captured by a script.
    println!("{}", serde_json::to_string(&account).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

pub async fn projections(cmd: ProjectionsCommand, out: &Output) -> Result<ExitCode, CliError> {
    let ProjectionsCommand::Rebuild { batch_size } = cmd;
    let report = store::projections::rebuild_in_batches(&pool().await?, batch_size)
        .await
        .context("rebuilding the projections")?;
    out.print(&report, || {
        let mut lines: Vec<String> = [("orders", &report.orders), ("shipments", &report.shipments)]
            .iter()
            .map(|(table, t)| {
                format!(
                    "{table}: folded {} rows from their events; {} differed and were corrected; {} without events removed",
                    t.rows, t.corrected, t.orphans_removed
                )
            })
            .collect();
        lines.push(format!("in {} transactions of at most {batch_size} streams", report.batches));
        lines.join("\n")
    });
    Ok(ExitCode::SUCCESS)
}

pub async fn audit(
    options: store::audit::AuditOptions,
    incremental: bool,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let started = std::time::Instant::now();
    let pool = pool().await?;
    let mut audit = if incremental {
        store::audit::incremental(&pool, &options).await
    } else {
        store::audit::full(&pool, &options).await
    }
    .context("running the audit")?;
    let report = &mut audit.report;
    // The stream is a copy the broker can lose a tail of: compared with `events` when NATS_URL is set.
    // An incremental audit compares the part of the stream its window covers
    // (a rollback of older messages is the relay's watcher's to see, and the
    // next full pass's).
    let since = match report.from_position {
        Some(from) => bus::repair::Since::Position(from),
        None => bus::repair::Since::All,
    };
    let stream = crate::stream::audit_gap(&pool, since).await?;
    if let Some(gap) = stream.as_ref().filter(|g| g.missing > 0) {
        report.flag(
            "stream_gap",
            bus::STREAM,
            format!(
                "the stream lacks {} of the events that left the outbox, the first at position {} (soldonce stream repair republishes them)",
                gap.missing,
                gap.first_missing.unwrap_or_default()
            ),
        );
    }
    audit
        .record(&pool)
        .await
        .context("recording the audit in audit_runs")?;
    let report = &audit.report;
    let seconds = started.elapsed().as_secs_f64();
    let value = serde_json::json!({ "clean": report.clean(), "seconds": seconds, "report": report, "stream": stream });
    out.print(&value, || {
        let scope = match report.from_position {
            Some(from) => format!("incremental (events after position {from}): "),
            None => "full pass: ".to_owned(),
        };
        let mut t = format!(
            "{scope}audited {} SKUs, {} orders, {} events, {} payments in {seconds:.2}s; outbox backlog {} (oldest {:.0}s)",
            report.skus, report.orders, report.events, report.payments, report.outbox_backlog, report.outbox_oldest_seconds
        );
        match &stream {
            Some(s) => t.push_str(&format!(
                "\nstream: compared {} events with {} messages",
                s.expected, s.scanned
            )),
            None => t.push_str("\nstream: not compared (NATS_URL is not set)"),
        }
        if report.clean() {
            t.push_str("\nclean: every invariant holds");
        }
        for v in &report.violations {
            t.push_str(&format!("\nVIOLATION {} {}: {}", v.check, v.subject, v.detail));
        }
        let unlisted = report.violation_count.saturating_sub(report.violations.len() as u64);
        if unlisted > 0 {
            t.push_str(&format!("\n... and {unlisted} more violations"));
        }
        t
    });
    Ok(if report.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Shows the last recorded audit run.
pub async fn last_audit(out: &Output) -> Result<ExitCode, CliError> {
    let pool = pool().await?;
    let Some(run) = store::audit::last(&pool)
        .await
        .context("reading audit_runs")?
    else {
        return Err(CliError::Failed(anyhow::anyhow!(
            "no audit has been recorded yet: run `soldonce audit`"
        )));
    };
    out.print(&run, || {
        let mut t = format!(
            "last audit: {} at {} ({:.2}s), {} orders, {} events, {} violations",
            run.kind,
            run.started_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            run.seconds,
            run.orders,
            run.events,
            run.violation_count
        );
        for (check, n) in &run.checks {
            t.push_str(&format!("\n  {check}: {n}"));
        }
        t
    });
    Ok(if run.violation_count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
