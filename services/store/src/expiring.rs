//! Releasing reservations whose payment window passed, on the database's
//! clock, a batch per transaction, with a bad row set aside instead of
//! failing its batch.
//!
//! "Due" is `expires_at <= now()` in the claiming statement, and the
//! `order.expired` event is stamped with that transaction's `now()`: no
//! host's clock decides. An order that cannot be read back (a projection
//! row the domain cannot decode) or whose release finds its stock row short
//! (fewer units reserved than it holds: a bucket edited by hand) is left
//! out and reported, and the rest of its batch is released; the caller
//! keeps the ones it was told about out of its next claims.

use crate::orders::{select_orders, OrderRow};
use crate::statement::Written;
use crate::write::{self, Changes};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Command, Order, Sku};
use events::Metadata;
use sqlx::PgPool;
use uuid::Uuid;

/// An overdue order that could not be released, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub order_id: Uuid,
    pub reason: String,
}

/// What one call released and set aside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Orders expired (committed).
    pub expired: u64,
    /// Orders claimed: less than the limit means nothing else was due.
    pub claimed: u64,
    /// Orders left out, each with its reason.
    pub skipped: Vec<Skipped>,
}

/// The claim: overdue orders on the database's clock, minus those the
/// caller set aside, read after their lock (`SKIP LOCKED`: never waits,
/// so the order of the locks cannot deadlock), so a payment that committed
/// first is seen and the domain declines to expire its order.
const CLAIM: &str = concat!(
    select_orders!(),
    " WHERE o.state = 'payment_pending' AND o.expires_at <= now() AND o.id <> ALL($2) \
      ORDER BY o.expires_at LIMIT $1 FOR UPDATE OF o SKIP LOCKED"
);

/// Expires up to `limit` overdue orders in one transaction, on the write
/// path (each SKU's buckets moved once for the batch); safe with N
/// processes. `source` names the caller in the events' metadata; orders in
/// `skip` are not claimed. A short stock row sets aside the orders of the
/// batch that hold that SKU and the batch is claimed again without them.
pub async fn expire_due(
    pool: &PgPool,
    limit: i64,
    source: &str,
    skip: &[Uuid],
) -> Result<Released, StoreError> {
    let mut excluded = skip.to_vec();
    let mut skipped: Vec<Skipped> = Vec::new();
    loop {
        let mut tx = pool.begin().await?;
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        let rows: Vec<OrderRow> = sqlx::query_as(CLAIM)
            .bind(limit)
            .bind(&excluded)
            .fetch_all(&mut *tx)
            .await?;
        let claimed = rows.len() as u64;
        let (changes, expiring) = decide_expiries(rows, now, source, &mut excluded, &mut skipped)?;
        if expiring.is_empty() {
            tx.rollback().await?;
            return Ok(Released {
                expired: 0,
                claimed,
                skipped,
            });
        }
        match write::commit(&mut tx, &changes).await? {
            Written::Done => {
                tx.commit().await?;
                return Ok(Released {
                    expired: expiring.len() as u64,
                    claimed,
                    skipped,
                });
            }
            Written::StockShort(sku) => {
                // Now, not when the pool next uses the connection: until then the
                // batch's row locks stay, and the claim again would skip them.
                tx.rollback().await?;
                set_aside_holders(&expiring, &sku, &mut excluded, &mut skipped);
            }
        }
    }
}

/// Decides the expiry of each claimed row at `now`: the changes to write
/// and the orders that expire. A row the domain cannot read is set aside
/// (into `excluded` and `skipped`); an order the domain declines to expire
/// is left as it is.
fn decide_expiries(
    rows: Vec<OrderRow>,
    now: DateTime<Utc>,
    source: &str,
    excluded: &mut Vec<Uuid>,
    skipped: &mut Vec<Skipped>,
) -> Result<(Changes, Vec<Order>), StoreError> {
    let mut changes = Changes::new();
    let mut expiring: Vec<Order> = Vec::with_capacity(rows.len());
    for row in rows {
        let id = row.id;
        let order = match Order::try_from(row) {
            Ok(o) => o,
            Err(e) => {
                excluded.push(id);
                skipped.push(Skipped {
                    order_id: id,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let Ok(events) = domain::decide(Some(&order), Command::Expire { at: now }) else {
            continue;
        };
        if events.is_empty() {
            continue;
        }
        changes.order(
            Some(&order),
            &events,
            &Metadata::spontaneous(source, order.id),
        )?;
        expiring.push(order);
    }
    Ok((changes, expiring))
}

/// Sets aside (into `excluded` and `skipped`) the expiring orders that hold
/// `sku`, whose stock row turned out short.
fn set_aside_holders(
    expiring: &[Order],
    sku: &Sku,
    excluded: &mut Vec<Uuid>,
    skipped: &mut Vec<Skipped>,
) {
    for order in expiring
        .iter()
        .filter(|o| o.lines.iter().any(|l| l.sku == *sku))
    {
        excluded.push(order.id);
        skipped.push(Skipped {
            order_id: order.id,
            reason: format!("stock row {sku} holds fewer units than its expiring orders"),
        });
    }
}
