//! An operator cancels an order (`soldonce order cancel`, checkout's admin
//! API). A pending order is cancelled as its buyer would; a confirmed one
//! only before its goods leave: in one transaction its
//! `order.operator_cancelled` event puts the units back on sale, its
//! shipment (if fulfillment made one) is cancelled, and the money is
//! decided back as an operator refund under the key `soldonce:cancel` — a
//! void of an uncaptured authorization, else a refund of what earlier
//! refunds left; nothing of a disputed payment, the bank's to settle —
//! which the payment worker carries out (`operator_refunds`). A dispute's
//! hold on the shipment is released with it: the shipment never moves.
//!
//! The cancel cannot race the warehouse: the order's row, then its
//! shipment's, are locked before the shipment's state is read (the lock
//! order of every path), so a shipment that ships first is seen shipped and
//! the cancel refused, and one cancelled first never moves again
//! ([`crate::shipments::advance_due`] skips it). An order fulfillment has
//! not made a shipment for yet is no longer confirmed when it looks.

use crate::operator_refunds::{self, OperatorRefund};
use crate::orders;
use crate::statement::Written;
use crate::write::{self, Changes};
use crate::StoreError;
use domain::operator::CANCEL_KEY;
use domain::shipment::{self, ShipmentCommand};
use domain::{Command, DomainError, Event, Order};
use events::Metadata;
use sqlx::PgPool;
use uuid::Uuid;

/// What became of an operator's cancel.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// Cancelled now; `money`: the void or refund decided, if anything was
    /// to be given back.
    Now {
        order: Box<Order>,
        money: Option<OperatorRefund>,
    },
    /// Cancelled before: nothing new.
    Already(Box<Order>),
    /// Refused (its goods left, a dispute, an order that ended otherwise):
    /// nothing changed.
    Refused(DomainError),
    NotFound,
}

/// Cancels `order_id` for an operator (`requested_by`), giving `reason`.
pub async fn cancel(
    pool: &PgPool,
    order_id: Uuid,
    reason: &str,
    requested_by: &str,
    source: &str,
) -> Result<Cancelled, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(order) = orders::load_locked(&mut tx, order_id, None).await? else {
        return Ok(Cancelled::NotFound);
    };
    let shipment = crate::shipments::for_order_locked(&mut tx, order_id).await?;
    let at = crate::now();
    let command = Command::CancelByOperator {
        shipped: shipment.as_ref().is_some_and(|s| s.state.has_left()),
        reason: reason.to_owned(),
        at,
    };
    let events = match domain::decide(Some(&order), command) {
        Ok(events) if events.is_empty() => return Ok(Cancelled::Already(Box::new(order))),
        Ok(events) => events,
        Err(e) => return Ok(Cancelled::Refused(e)),
    };
    let meta = Metadata::spontaneous(source, order_id);
    let mut changes = Changes::new();
    let next = changes.order(Some(&order), &events, &meta)?;
    let stopping = events
        .iter()
        .any(|e| matches!(e, Event::OperatorCancelled { .. }));
    if stopping {
        let stopped = shipment::decide(shipment.as_ref(), ShipmentCommand::Cancel { at });
        changes.shipment(shipment.as_ref(), &stopped, &meta)?;
    }
    if let Written::StockShort(sku) = write::commit(&mut tx, &changes).await? {
        return Err(StoreError::Corrupt(format!(
            "order {order_id}: its sold units of {sku} are not in the sold bucket"
        )));
    }
    if stopping {
        // A dispute's hold on a shipment that will never move is moot: released
        // (its finding stays open for the person who answers the dispute).
        sqlx::query(
            "UPDATE shipment_holds SET released_at = now(), released_by = left($2, 200) \
             WHERE order_id = $1 AND released_at IS NULL",
        )
        .bind(order_id)
        .bind(requested_by)
        .execute(&mut *tx)
        .await?;
    }
    let money = if next.operator_refunds.iter().any(|r| r.key == CANCEL_KEY) {
        Some(operator_refunds::insert(&mut tx, &next, CANCEL_KEY, requested_by).await?)
    } else {
        None
    };
    tx.commit().await?;
    Ok(Cancelled::Now {
        order: Box::new(next),
        money,
    })
}
