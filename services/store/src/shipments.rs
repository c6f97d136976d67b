//! Shipments: one per confirmed order, advanced step by step. Each step is
//! an event in the shipment's own stream, with its outbox row, committed with
//! the `shipments` row that caches the current state.

use crate::orders::{append_records, Record};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::{ShipmentEvent, ShipmentState};
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use std::time::Duration;
use uuid::Uuid;

/// A shipment as the `shipments` row holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    pub id: Uuid,
    pub order_id: Uuid,
    pub state: ShipmentState,
}

fn record<'a>(
    event: &ShipmentEvent,
    version: i32,
    meta: &'a Metadata,
) -> Result<Record<'a>, StoreError> {
    Ok(Record {
        stream_id: event.shipment_id,
        version,
        meta,
        type_name: event.state.event_type(),
        subject: events::names::subject(event.state.event_type(), event.shipment_id),
        data: serde_json::to_value(event).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        at: event.at,
    })
}

/// Creates the order's shipment unless it has one; returns the new id.
pub async fn create(
    conn: &mut PgConnection,
    order_id: Uuid,
    meta: &Metadata,
) -> Result<Option<Uuid>, StoreError> {
    let id = Uuid::now_v7();
    let at = crate::now();
    let created: Option<(Uuid,)> = sqlx::query_as(
        "INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) VALUES ($1, $2, 'pending', 1, $3, $3) \
         ON CONFLICT (order_id) DO NOTHING RETURNING id",
    )
    .bind(id)
    .bind(order_id)
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?;
    if created.is_none() {
        return Ok(None);
    }
    let event = ShipmentEvent {
        shipment_id: id,
        order_id,
        state: ShipmentState::Pending,
        at,
    };
    append_records(conn, &[record(&event, 1, meta)?]).await?;
    Ok(Some(id))
}

/// Moves every shipment whose last step is older than `step_delay` one
/// step on; safe with N fulfillment processes. Returns how many moved.
pub async fn advance_due(
    pool: &PgPool,
    step_delay: Duration,
    limit: i64,
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let due: Vec<(Uuid, Uuid, String, i32, DateTime<Utc>)> = sqlx::query_as(
        "SELECT id, order_id, state, version, updated_at FROM shipments \
         WHERE state <> 'delivered' AND updated_at <= now() - make_interval(secs => $1) \
         ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(step_delay.as_secs_f64())
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let mut moved = 0;
    for (id, order_id, state, version, _) in due {
        let Some(next) = ShipmentState::parse(&state).and_then(ShipmentState::next) else {
            continue;
        };
        let at = crate::now();
        sqlx::query("UPDATE shipments SET state = $2, version = $3, updated_at = $4 WHERE id = $1")
            .bind(id)
            .bind(next.as_str())
            .bind(version + 1)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        let meta = Metadata {
            correlation_id: order_id,
            causation_id: Uuid::now_v7(),
            source: "fulfillment".into(),
            traceparent: None,
        };
        let event = ShipmentEvent {
            shipment_id: id,
            order_id,
            state: next,
            at,
        };
        append_records(&mut tx, &[record(&event, version + 1, &meta)?]).await?;
        moved += 1;
    }
    tx.commit().await?;
    Ok(moved)
}

/// The order's shipment, if it has one.
pub async fn for_order(pool: &PgPool, order_id: Uuid) -> Result<Option<Shipment>, StoreError> {
    let row: Option<(Uuid, String)> =
        sqlx::query_as("SELECT id, state FROM shipments WHERE order_id = $1")
            .bind(order_id)
            .fetch_optional(pool)
            .await?;
    row.map(|(id, state)| {
        let state = ShipmentState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("shipment {id}: state {state:?}")))?;
        Ok(Shipment {
            id,
            order_id,
            state,
        })
    })
    .transpose()
}
