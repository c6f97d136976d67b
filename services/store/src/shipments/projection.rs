//! The shipments projection's SQL: rows inserted, and rows updated fenced
//! on their version, as fragments of the write path's one statement.

use crate::statement::Statement;
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::Shipment;
use uuid::Uuid;

/// Inserts new shipments' rows, as a fragment of `statement`; an order
/// that already has one is `StoreError::Conflict`.
pub(crate) fn insert<'q>(
    statement: &mut Statement<'q>,
    shipments: &'q [Shipment],
) -> Result<(), StoreError> {
    let Some(first) = shipments.first() else {
        return Ok(());
    };
    let s = statement;
    let ids = s.bind(shipments.iter().map(|s| s.id).collect::<Vec<Uuid>>())?;
    let orders = s.bind(shipments.iter().map(|s| s.order_id).collect::<Vec<Uuid>>())?;
    let states = s.bind(
        shipments
            .iter()
            .map(|s| s.state.as_str())
            .collect::<Vec<&str>>(),
    )?;
    let versions = s.bind(shipments.iter().map(|s| s.version).collect::<Vec<i32>>())?;
    let times = s.bind(
        shipments
            .iter()
            .map(|s| s.updated_at)
            .collect::<Vec<DateTime<Utc>>>(),
    )?;
    s.cte(
        "shipped",
        &format!(
            "INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) \
             SELECT id, o, st, v, at, at FROM unnest({ids}::uuid[], {orders}::uuid[], {states}::text[], {versions}::int[], {times}::timestamptz[]) AS x(id, o, st, v, at) \
             RETURNING 1"
        ),
    );
    s.expect_rows("shipped", shipments.len(), first.order_id);
    s.on_taken("shipments_order_id_key", first.order_id);
    Ok(())
}

/// Updates shipments' rows, as a fragment of `statement`, each fenced on
/// its version: a concurrent writer is `StoreError::Conflict`.
pub(crate) fn update<'q>(
    statement: &mut Statement<'q>,
    shipments: &'q [(i32, Shipment)],
) -> Result<(), StoreError> {
    let Some((_, first)) = shipments.first() else {
        return Ok(());
    };
    let s = statement;
    let ids = s.bind(shipments.iter().map(|(_, s)| s.id).collect::<Vec<Uuid>>())?;
    let states = s.bind(
        shipments
            .iter()
            .map(|(_, s)| s.state.as_str())
            .collect::<Vec<&str>>(),
    )?;
    let versions = s.bind(
        shipments
            .iter()
            .map(|(_, s)| s.version)
            .collect::<Vec<i32>>(),
    )?;
    let times = s.bind(
        shipments
            .iter()
            .map(|(_, s)| s.updated_at)
            .collect::<Vec<DateTime<Utc>>>(),
    )?;
    let before = s.bind(shipments.iter().map(|(b, _)| *b).collect::<Vec<i32>>())?;
    s.cte(
        "advanced",
        &format!(
            "UPDATE shipments s SET state = x.st, version = x.v, updated_at = x.at \
             FROM unnest({ids}::uuid[], {states}::text[], {versions}::int[], {times}::timestamptz[], {before}::int[]) AS x(id, st, v, at, b) \
             WHERE s.id = ANY({ids}::uuid[]) AND s.id = x.id AND s.version = x.b \
             RETURNING 1"
        ),
    );
    s.expect_rows("advanced", shipments.len(), first.id);
    Ok(())
}
