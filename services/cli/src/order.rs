//! `soldonce order refund`: an operator refunds part or all of what a
//! confirmed order's payment took, once per key. The refund is decided here
//! (an event on the order's stream, and durable work); the payment worker
//! carries it out until the PSP confirms it.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use std::process::ExitCode;
use store::operator_refunds::Asked;
use uuid::Uuid;

/// What `soldonce order refund` takes.
#[derive(Debug, clap::Args)]
pub struct RefundArgs {
    /// The order's id.
    pub id: String,
    /// The amount to refund, in minor units (cents).
    #[arg(long, required_unless_present = "line", conflicts_with = "line")]
    pub amount_minor: Option<i64>,
    /// Refund these units of one line (`SKU:QTY`), at the price the order was placed at; repeatable.
    #[arg(long, value_name = "SKU:QTY")]
    pub line: Vec<String>,
    /// Your idempotency key: asking again with it refunds nothing more.
    #[arg(long)]
    pub key: String,
    /// Who asks (recorded with the refund).
    #[arg(long, default_value = "operator")]
    pub by: String,
}

/// Decides the refund; exit 2 when it is refused (nothing changed).
pub async fn refund(args: RefundArgs, out: &Output) -> Result<ExitCode, CliError> {
    let id: Uuid = args
        .id
        .parse()
        .map_err(|_| CliError::Usage(format!("{:?} is not an order id (a UUID)", args.id)))?;
    let pool = crate::admin::pool().await?;
    let amount = match args.amount_minor {
        Some(amount) => amount,
        None => lines_amount(&pool, id, &args.line).await?,
    };
    let asked = store::operator_refunds::ask(&pool, id, &args.key, amount, &args.by, "cli")
        .await
        .context("recording the refund")?;
    let (row, again) = match asked {
        Asked::Decided(row) => (row, false),
        Asked::Again(row) => (row, true),
        Asked::Refused(why) => return Err(CliError::Usage(format!("refund refused: {why}"))),
        Asked::NotFound => return Err(CliError::Usage(format!("no order {id}"))),
    };
    out.print(&row, || {
        let verb = if again {
            "already asked with this key"
        } else {
            "decided"
        };
        format!(
            "refund {:?} of {} {} on payment {} {verb}: {} (the payment worker carries it out)\n",
            row.key, row.amount_minor, row.currency, row.payment_id, row.state
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// The amount `--line SKU:QTY` arguments come to, at the order's prices.
async fn lines_amount(pool: &sqlx::PgPool, id: Uuid, lines: &[String]) -> Result<i64, CliError> {
    let order = store::orders::load(pool, id, None)
        .await
        .context("reading the order")?
        .ok_or_else(|| CliError::Usage(format!("no order {id}")))?;
    let mut total = 0i64;
    for line in lines {
        let (sku, qty) = line
            .split_once(':')
            .and_then(|(s, q)| Some((s, q.parse::<i64>().ok()?)))
            .filter(|(_, q)| *q > 0)
            .ok_or_else(|| {
                CliError::Usage(format!("--line {line:?}: expected SKU:QTY, QTY at least 1"))
            })?;
        let ordered = order
            .lines
            .iter()
            .find(|l| l.sku.as_str() == sku)
            .ok_or_else(|| {
                CliError::Usage(format!("--line {line:?}: the order has no line {sku}"))
            })?;
        if qty > ordered.quantity.get() {
            return Err(CliError::Usage(format!(
                "--line {line:?}: the order has {} of {sku}",
                ordered.quantity.get()
            )));
        }
        total = ordered
            .unit_price_minor
            .checked_mul(qty)
            .and_then(|a| total.checked_add(a))
            .ok_or_else(|| CliError::Usage(format!("--line {line:?}: the amount overflows")))?;
    }
    Ok(total)
}
