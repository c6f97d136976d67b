//! `soldonce reconcile`: one reconciliation of soldonce's books with the
//! PSP's, the same the payment worker runs periodically. Every payment of
//! soldonce's the walk finds unattached gets a refund recorded (the payment
//! worker carries it out); payments soldonce did not make are listed as
//! foreign and never touched; what cannot be repaired is named, with exit code 1.

use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `soldonce reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Walk payments created since this time: RFC 3339 (`2026-12-01T00:00:00Z`) or an age (`24h`).
    /// Default: every payment the PSP holds.
    #[arg(long, value_parser = since)]
    since: Option<DateTime<Utc>>,
    /// Per-call timeout of the PSP.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    psp_timeout: Duration,
}

fn since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let age = humantime::parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor an age such as 24h"))?;
    let age = chrono::Duration::from_std(age).map_err(|_| format!("{text:?} is too long ago"))?;
    Utc::now()
        .checked_sub_signed(age)
        .ok_or_else(|| format!("{text:?} is too long ago"))
}

/// Runs one reconciliation and prints its report.
pub async fn run(args: ReconcileArgs, out: &Output) -> Result<ExitCode, CliError> {
    let psp_url = platform::config::psp_url().map_err(|e| CliError::Usage(e.to_string()))?;
    let pool = pool().await?;
    // Reconciliation reads the provider's books one page at a time.
    let psp = payments::psp::Psp::new(&psp_url, args.psp_timeout, args.psp_timeout, 1)
        .context("PSP client")?;
    let report = payments::reconcile::run(&pool, &psp, args.since, false)
        .await
        .context("reconciling with the PSP")?;
    out.print(&serde_json::json!({ "clean": report.clean(), "report": report }), || {
        let mut t = format!(
            "reconciled {} PSP payments ({} succeeded) and {} confirmed orders in {:.2}s; {} repaired",
            report.payments_seen, report.succeeded, report.confirmed_orders_checked, report.seconds, report.repaired
        );
        if !report.foreign.is_empty() {
            t.push_str(&format!(
                "\n{} foreign payments (not made by soldonce) left alone",
                report.foreign.len()
            ));
        }
        for p in report.foreign.iter().take(20) {
            let reference = p.reference.as_deref().unwrap_or("-");
            t.push_str(&format!(
                "\nFOREIGN {} {} {} {} reference {reference}",
                p.payment_id, p.status, p.amount_minor, p.currency
            ));
        }
        for f in &report.findings {
            let tag = if f.repaired { "REPAIRED" } else { "FINDING" };
            t.push_str(&format!("\n{tag} {} {}: {}", f.kind, f.subject, f.detail));
        }
        if report.clean() {
            t.push_str("\nclean: every payment is attached to one confirmed order or refunded");
        }
        t
    });
    Ok(if report.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
