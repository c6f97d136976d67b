//! Shipments: one per confirmed order, advanced step by step as
//! `domain::shipment` decides. Each step is an event in the shipment's own
//! stream, committed on the write path with the `shipments` row that caches
//! the current state (its SQL fragments in `projection.rs`).

use crate::write::{self, Changes};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::{self, ShipmentCommand, ShipmentState};
use domain::OrderState;
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;
use uuid::Uuid;

mod advance;
pub(crate) mod projection;

pub use advance::{advance_due, Advanced};
pub use domain::shipment::Shipment;

#[derive(sqlx::FromRow)]
struct ShipmentRow {
    id: Uuid,
    order_id: Uuid,
    state: String,
    version: i32,
    updated_at: DateTime<Utc>,
}

impl TryFrom<ShipmentRow> for Shipment {
    type Error = StoreError;
    fn try_from(r: ShipmentRow) -> Result<Shipment, StoreError> {
        let state = ShipmentState::parse(&r.state).ok_or_else(|| {
            StoreError::Corrupt(format!("shipment {}: state {:?}", r.id, r.state))
        })?;
        Ok(Shipment {
            id: r.id,
            order_id: r.order_id,
            state,
            version: r.version,
            updated_at: r.updated_at,
        })
    }
}

/// A row of [`create_many`]'s locking read: an order (`shipment` false:
/// its id and state) or a shipment.
#[derive(sqlx::FromRow)]
struct LockedRow {
    shipment: bool,
    id: Uuid,
    order_id: Uuid,
    state: String,
    version: Option<i32>,
    updated_at: Option<DateTime<Utc>>,
}

const SELECT: &str = "SELECT id, order_id, state, version, updated_at FROM shipments";
/// The orders whose shipment a dispute holds (add a condition on `h.order_id`).
const HELD: &str = "SELECT h.order_id FROM shipment_holds h WHERE h.released_at IS NULL";

/// What [`create_many`] did for one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new shipment, with its id.
    New(Uuid),
    /// The order already had its shipment (a redelivery, a repeat in the batch).
    Existed,
    /// Not shipped: the database says the order is not confirmed (`None`: no such order).
    NotConfirmed(Option<OrderState>),
}

/// The orders of a batch of confirmations, share-locked in id order, then
/// their shipments, locked: one row per order, then one per shipment. The
/// statement runs inside a function that plans it at every call on the
/// tables as they are then (migration `planned_at_each_call`), in one round
/// trip: prepared, PostgreSQL kept a generic plan made while orders and
/// shipments were nearly empty, which scanned both whole at each call as
/// they grew (503 blocks a call on average over a 15,000-order run of
/// `statements.sh CLOSED=1`).
pub const LOCK_ORDERS_SQL: &str = "SELECT * FROM shipments_locking($1)";

/// Creates each confirmed order's shipment unless it has one, in the
/// caller's transaction, set-based: the orders' states (share-locked in id
/// order, the order every batch locks orders in, so they cannot change
/// meanwhile) with their shipments, then the new shipments with their
/// events, are each one statement for the whole batch. One answer per order, in the
/// order given. Never ships what the database does not say is confirmed.
pub async fn create_many(
    conn: &mut PgConnection,
    orders: &[(Uuid, Metadata)],
) -> Result<Vec<Created>, StoreError> {
    if orders.is_empty() {
        return Ok(vec![]);
    }
    let mut ids: Vec<Uuid> = orders.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    // The orders first (share-locked in id order, the order every batch
    // locks orders in), then their shipments: one statement, as the
    // `UNION ALL` runs its branches one after the other and each CTE's
    // scan locks its rows in its own `ORDER BY`.
    let rows: Vec<LockedRow> = sqlx::query_as(LOCK_ORDERS_SQL)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
    let mut states: HashMap<Uuid, OrderState> = HashMap::with_capacity(ids.len());
    let mut shipped: HashMap<Uuid, Shipment> = HashMap::new();
    for row in rows {
        match (row.shipment, row.version, row.updated_at) {
            (false, _, _) => {
                states.insert(row.id, crate::orders::row::parse_state(row.id, &row.state)?);
            }
            (true, Some(version), Some(updated_at)) => {
                let s = Shipment::try_from(ShipmentRow {
                    id: row.id,
                    order_id: row.order_id,
                    state: row.state,
                    version,
                    updated_at,
                })?;
                shipped.insert(s.order_id, s);
            }
            (true, _, _) => {
                return Err(StoreError::Corrupt(format!(
                    "shipment {}: no version or time",
                    row.id
                )))
            }
        }
    }
    let mut changes = Changes::new();
    let mut answers = Vec::with_capacity(orders.len());
    for (order_id, meta) in orders {
        let state = states.get(order_id).copied();
        if state != Some(OrderState::Confirmed) {
            answers.push(Created::NotConfirmed(state));
            continue;
        }
        let current = shipped.get(order_id);
        let events = shipment::decide(
            current,
            ShipmentCommand::Create {
                shipment_id: Uuid::now_v7(),
                order_id: *order_id,
                at: crate::now(),
            },
        );
        match changes.shipment(current, &events, meta)? {
            Some(s) if current.is_none() => {
                answers.push(Created::New(s.id));
                shipped.insert(*order_id, s);
            }
            _ => answers.push(Created::Existed),
        }
    }
    write::commit(conn, &changes).await?;
    Ok(answers)
}

/// The order's shipment, if it has one.
pub async fn for_order(pool: &PgPool, order_id: Uuid) -> Result<Option<Shipment>, StoreError> {
    let row: Option<ShipmentRow> = sqlx::query_as(&format!("{SELECT} WHERE order_id = $1"))
        .bind(order_id)
        .fetch_optional(pool)
        .await?;
    row.map(Shipment::try_from).transpose()
}

/// The order's shipment, if it has one, its row locked (after the
/// order's, the order every path locks them in), in the caller's transaction.
pub(crate) async fn for_order_locked(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<Shipment>, StoreError> {
    let row: Option<ShipmentRow> =
        sqlx::query_as(&format!("{SELECT} WHERE order_id = $1 FOR UPDATE"))
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await?;
    row.map(Shipment::try_from).transpose()
}
