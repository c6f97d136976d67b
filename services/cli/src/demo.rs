//! `soldonce demo flash-sale`: a flash sale through the whole running saga —
//! many buyers press "buy" on a few units at once; the winners are charged,
//! shipped, and the audit proves every invariant. Exit 1 if anything is off.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// Run a flash sale against the running system (DATABASE_URL, CHECKOUT_URL, SOLDONCE_TOKEN; see `soldonce up`).
    FlashSale {
        #[arg(long, default_value_t = 300)]
        buyers: usize,
        #[arg(long, default_value_t = 1)]
        stock: i64,
    },
}

/// What the flash sale came to.
#[derive(Debug, Serialize)]
struct Summary {
    sku: String,
    buyers: usize,
    stock: i64,
    accepted: u64,
    sold_out: u64,
    /// Every answer by HTTP status (a `429` is the account's rate limit:
    /// the demo's buyers share one account).
    answers: std::collections::BTreeMap<String, u64>,
    paid: i64,
    failed: i64,
    expired: i64,
    shipped: i64,
    available: i64,
    reserved: i64,
    sold: i64,
    audit_clean: bool,
    violations: Vec<String>,
    ok: bool,
}

pub async fn run(cmd: DemoCommand, out: &Output) -> Result<ExitCode, CliError> {
    let DemoCommand::FlashSale { buyers, stock } = cmd;
    let usage = |e: platform::ConfigError| {
        CliError::Usage(format!("{e} (run `soldonce up` and source its env file)"))
    };
    let url = platform::config::var("CHECKOUT_URL", "checkout's base URL")
        .required()
        .map_err(usage)?;
    let token = platform::config::var("SOLDONCE_TOKEN", "an account's API token")
        .required()
        .map_err(usage)?;
    let pool = crate::database::pool().await?;
    flash_sale(&pool, &url, &token, buyers, stock, out).await
}

/// Sells `stock` units of a fresh SKU to `buyers` simultaneous buyers and
/// waits for the saga to settle every winner.
pub async fn flash_sale(
    pool: &sqlx::PgPool,
    url: &str,
    token: &str,
    buyers: usize,
    stock: i64,
    out: &Output,
) -> Result<ExitCode, CliError> {
    if buyers == 0 || stock < 1 {
        return Err(CliError::Usage(
            "--buyers and --stock must be at least 1".into(),
        ));
    }
    let sku = stocked_sku(pool, stock).await?;
    eprintln!("demo: {buyers} buyers press buy on {stock} unit(s) of {sku} at the same moment");
    let report = crate::load::flash_sale(pool, url, token, sku.as_str(), buyers).await?;
    let counts = wait_settled(pool, &sku).await?;
    let summary = summarize(pool, &sku, buyers, stock, &report, &counts).await?;
    out.print(&summary, || render(&summary, &crate::load::render(&report)));
    Ok(if summary.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A fresh SKU for this sale, with `stock` units received.
async fn stocked_sku(pool: &sqlx::PgPool, stock: i64) -> Result<domain::Sku, CliError> {
    let sku = domain::Sku::parse(&format!(
        "FLASH-{}",
        chrono::Utc::now().format("%Y%m%d%H%M%S%3f")
    ))
    .context("flash sku")?;
    store::catalog::add_product(
        pool,
        &sku,
        "flash sale T-shirt",
        4990,
        "BRL".parse().context("currency")?,
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    store::catalog::receive(pool, &sku, stock)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(sku)
}

/// The SKU's orders by state once every winner is paid and shipped, or as
/// they stand after a minute.
async fn wait_settled(
    pool: &sqlx::PgPool,
    sku: &domain::Sku,
) -> Result<store::order_counts::SkuOrders, CliError> {
    // Wait (bounded) for payment and shipping of the winners.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = store::order_counts::of_sku(pool, sku.as_str())
            .await
            .context("reading order states")?;
        if (counts.payment_pending == 0 && counts.delivered == counts.confirmed)
            || Instant::now() > deadline
        {
            return Ok(counts);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the sale came to: the answers, the orders' states, the SKU's
/// buckets and a recorded audit; `ok` when they all agree.
async fn summarize(
    pool: &sqlx::PgPool,
    sku: &domain::Sku,
    buyers: usize,
    stock: i64,
    report: &crate::load::Report,
    counts: &store::order_counts::SkuOrders,
) -> Result<Summary, CliError> {
    let (paid, failed, expired, shipped) = (
        counts.confirmed,
        counts.payment_failed,
        counts.expired,
        counts.delivered,
    );
    let row = store::catalog::show(pool, Some(sku))
        .await
        .context("reading stock")?
        .into_iter()
        .next()
        .context("stock row")?;
    let audit = store::audit::full(pool, &store::audit::AuditOptions::default())
        .await
        .context("running the audit")?;
    audit.record(pool).await.context("recording the audit")?;
    let audit = audit.report;
    let sold_out = report.by_status.get("409").copied().unwrap_or(0);
    let ok = audit.clean()
        && report.orders_in_database == Some(report.accepted)
        && report.accepted <= u64::try_from(stock).unwrap_or(0)
        && row.reserved == 0
        && row.sold == paid
        && shipped == paid;
    Ok(Summary {
        sku: sku.to_string(),
        buyers,
        stock,
        accepted: report.accepted,
        sold_out,
        answers: report.by_status.clone(),
        paid,
        failed,
        expired,
        shipped,
        available: row.available,
        reserved: row.reserved,
        sold: row.sold,
        audit_clean: audit.clean(),
        violations: audit
            .violations
            .iter()
            .map(|v| format!("{} {}: {}", v.check, v.subject, v.detail))
            .collect(),
        ok,
    })
}

fn render(s: &Summary, load: &str) -> String {
    let mut t = format!(
        "{load}\n\n  flash sale of {} ({} unit(s), {} buyers)\n  ─────────────────────────────\n  accepted   {:>6}\n  sold out   {:>6}\n  paid       {:>6}\n  failed     {:>6}\n  expired    {:>6}\n  shipped    {:>6}\n  buckets    available {} / reserved {} / sold {}\n  audit      {}\n",
        s.sku, s.stock, s.buyers, s.accepted, s.sold_out, s.paid, s.failed, s.expired, s.shipped, s.available, s.reserved, s.sold,
        if s.audit_clean { "clean" } else { "VIOLATIONS" }
    );
    for v in &s.violations {
        t.push_str(&format!("  VIOLATION {v}\n"));
    }
    t.push_str(if s.ok {
        "  result     every unit sold once, every payment charged once: OK"
    } else {
        "  result     SOMETHING IS OFF"
    });
    t
}
