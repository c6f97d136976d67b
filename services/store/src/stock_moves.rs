//! Bucket movements caused by order events, each with its ledger row in the
//! same statement. Lines are visited in SKU order so two orders that share
//! SKUs always lock them in the same order: no deadlocks.

use domain::{Event, Order, OrderLine, Sku};
use sqlx::PgConnection;
use uuid::Uuid;

/// A movement between buckets for one order's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Movement {
    /// available → reserved (checkout).
    Reserve,
    /// reserved → sold (payment succeeded).
    Confirm,
    /// reserved → available (failed, cancelled, expired).
    Release,
    /// available → sold (a late payment re-reserves and confirms at once).
    Reclaim,
}

impl Movement {
    /// (available, reserved, sold) deltas per unit, and the ledger name.
    fn deltas(self) -> (i64, i64, i64, &'static str) {
        match self {
            Movement::Reserve => (-1, 1, 0, "reserve"),
            Movement::Confirm => (0, -1, 1, "confirm"),
            Movement::Release => (1, -1, 0, "release"),
            Movement::Reclaim => (-1, 0, 1, "reserve"),
        }
    }

    /// The movement an event causes, if any.
    pub(crate) fn for_event(event: &Event) -> Option<Movement> {
        match event {
            Event::Placed { .. } => Some(Movement::Reserve),
            Event::Confirmed {
                reactivated: false, ..
            } => Some(Movement::Confirm),
            Event::Confirmed {
                reactivated: true, ..
            } => Some(Movement::Reclaim),
            Event::PaymentFailed { .. } | Event::Cancelled { .. } | Event::Expired { .. } => {
                Some(Movement::Release)
            }
            Event::RefundDecided { .. } | Event::Refunded { .. } => None,
        }
    }
}

/// The statement that moves one line: conditional, so it never takes a
/// bucket below zero, and the ledger row is written only if it moved.
pub const MOVE_LINE_SQL: &str = "WITH m AS (UPDATE stock SET available = available + $2, reserved = reserved + $3, sold = sold + $4 \
     WHERE sku = $1 AND available + $2 >= 0 AND reserved + $3 >= 0 RETURNING sku) \
     INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id) \
     SELECT sku, $5, $2, $3, $4, $6 FROM m";

/// Moves every line; returns the first SKU that lacked the units (the
/// caller must then roll back).
pub(crate) async fn apply(
    conn: &mut PgConnection,
    order_id: Uuid,
    lines: &[OrderLine],
    movement: Movement,
) -> Result<Option<Sku>, sqlx::Error> {
    let (a, r, s, name) = movement.deltas();
    let mut sorted: Vec<&OrderLine> = lines.iter().collect();
    sorted.sort_by(|x, y| x.sku.cmp(&y.sku));
    for line in sorted {
        let q = line.quantity.get();
        let moved = sqlx::query(MOVE_LINE_SQL)
            .bind(line.sku.as_str())
            .bind(a * q)
            .bind(r * q)
            .bind(s * q)
            .bind(name)
            .bind(order_id)
            .execute(&mut *conn)
            .await?;
        if moved.rows_affected() == 0 {
            return Ok(Some(line.sku.clone()));
        }
    }
    Ok(None)
}

/// Applies the movement `event` causes on `order`'s lines.
pub(crate) async fn apply_event(
    conn: &mut PgConnection,
    order: &Order,
    event: &Event,
) -> Result<Option<Sku>, sqlx::Error> {
    match Movement::for_event(event) {
        Some(m) => apply(conn, order.id, &order.lines, m).await,
        None => Ok(None),
    }
}
