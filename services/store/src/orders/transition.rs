//! Order transitions: a command decided against an order under its row
//! lock, and the events it produced committed on the write path.

use super::reads::load_locked;
use crate::statement::Written;
use crate::write::{self, Changes};
use crate::StoreError;
use domain::{Command, DomainError, Event, Order, Sku};
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// What became of a command on an existing order.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Events were recorded; the order as it is now.
    Applied(Order),
    /// The command was already in effect: nothing recorded.
    Unchanged(Order),
    Refused(DomainError),
    NotFound,
    /// The units the command needed are gone (a late payment's reclaim).
    StockShort(Sku),
}

/// Runs `command` against an order under a row lock, in a transaction of
/// its own: decide, move stock, append. `account` scopes the lookup.
#[tracing::instrument(skip_all, fields(order_id = %order_id))]
pub async fn transition(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
    meta: &Metadata,
    command: impl FnOnce(&Order) -> Command,
) -> Result<Transition, StoreError> {
    let mut tx = pool.begin().await?;
    let outcome = transition_in(&mut tx, order_id, account, meta, command).await?;
    if matches!(outcome, Transition::Applied(_)) {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// Like [`transition`], inside the caller's transaction, which the caller
/// commits; on anything but `Applied` nothing was written (but the caller
/// must roll back after `StockShort`).
pub async fn transition_in(
    conn: &mut PgConnection,
    order_id: Uuid,
    account: Option<Uuid>,
    meta: &Metadata,
    command: impl FnOnce(&Order) -> Command,
) -> Result<Transition, StoreError> {
    let Some(order) = load_locked(conn, order_id, account).await? else {
        return Ok(Transition::NotFound);
    };
    let events = match domain::decide(Some(&order), command(&order)) {
        Ok(events) => events,
        Err(e) => return Ok(Transition::Refused(e)),
    };
    if events.is_empty() {
        return Ok(Transition::Unchanged(order));
    }
    Ok(match apply(conn, &order, &events, meta).await? {
        Applied::Done(next) => Transition::Applied(*next),
        Applied::StockShort(sku) => Transition::StockShort(sku),
    })
}

/// What became of decided events.
pub(crate) enum Applied {
    Done(Box<Order>),
    /// A stock movement lacked the units: nothing may be committed.
    StockShort(Sku),
}

/// Writes `events` on `order` (stock, events, outbox, projection) in the
/// caller's transaction; the caller rolls back after `StockShort`.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    order: &Order,
    events: &[Event],
    meta: &Metadata,
) -> Result<Applied, StoreError> {
    let mut changes = Changes::new();
    let next = changes.order(Some(order), events, meta)?;
    Ok(match write::commit(conn, &changes).await? {
        Written::Done => Applied::Done(Box::new(next)),
        Written::StockShort(sku) => Applied::StockShort(sku),
    })
}
