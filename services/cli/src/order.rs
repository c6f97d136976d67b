//! `soldonce order refund`: an operator refunds part or all of what a
//! confirmed order's payment took, once per key. The refund is decided here
//! (an event on the order's stream, and durable work); the payment worker
//! carries it out until the PSP confirms it. `soldonce order cancel`
//! cancels an order before its goods leave, deciding its void or refund
//! the same way.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use std::process::ExitCode;
use store::operator_cancels::Cancelled;
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

/// What `soldonce order cancel` takes.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// The order's id.
    pub id: String,
    /// Why (recorded on the order's event), at most 200 characters.
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Who asks (recorded with the refund or void).
    #[arg(long, default_value = "operator")]
    pub by: String,
}

/// Cancels the order; exit 2 when it is refused (nothing changed).
pub async fn cancel(args: CancelArgs, out: &Output) -> Result<ExitCode, CliError> {
    let id = order_id(&args.id)?;
    let pool = crate::database::pool().await?;
    let cancelled = store::operator_cancels::cancel(&pool, id, &args.reason, &args.by, "cli")
        .await
        .context("cancelling the order")?;
    let (order, money, again) = match cancelled {
        Cancelled::Now { order, money } => (order, money, false),
        Cancelled::Already(order) => (order, None, true),
        Cancelled::Refused(why) => return Err(CliError::Usage(format!("cancel refused: {why}"))),
        Cancelled::NotFound => return Err(CliError::Usage(format!("no order {id}"))),
    };
    let reply = serde_json::json!({
        "order_id": order.id,
        "outcome": if again { "already_cancelled" } else { "cancelled" },
        "state": order.state,
        "money": money,
    });
    out.print(&reply, || {
        let money = match &money {
            Some(m) if m.void => format!(
                "; its authorization of {} {} on payment {} is to be voided (the payment worker carries it out)",
                m.amount_minor, m.currency, m.payment_id
            ),
            Some(m) => format!(
                "; {} {} of payment {} is to be refunded (the payment worker carries it out)",
                m.amount_minor, m.currency, m.payment_id
            ),
            None if again => String::new(),
            None => "; no money to give back".into(),
        };
        if again {
            format!("order {id} was cancelled already: nothing changed")
        } else {
            format!("order {id} cancelled, its units back on sale{money}")
        }
    });
    Ok(ExitCode::SUCCESS)
}

/// Parses an order id argument.
fn order_id(raw: &str) -> Result<Uuid, CliError> {
    raw.parse()
        .map_err(|_| CliError::Usage(format!("{raw:?} is not an order id (a UUID)")))
}

/// Decides the refund; exit 2 when it is refused (nothing changed).
pub async fn refund(args: RefundArgs, out: &Output) -> Result<ExitCode, CliError> {
    let id = order_id(&args.id)?;
    let pool = crate::database::pool().await?;
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
