//! An order's history: its recorded events, the steps of its saga, and
//! the state they fold into.

use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Event, Order};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// One recorded event of an order's history.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RecordedEvent {
    pub event_id: Uuid,
    pub position: i64,
    pub version: i32,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
}

/// An order's events in recorded order, or `None` if the order is not the
/// account's.
pub async fn history(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Vec<RecordedEvent>>, StoreError> {
    let owned: Option<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM orders WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(pool)
    .await?;
    if owned.is_none() {
        return Ok(None);
    }
    let events = sqlx::query_as(
        "SELECT event_id, position, version, type, data, recorded_at FROM events WHERE stream_id = $1 ORDER BY version",
    )
    .bind(order_id)
    .fetch_all(pool)
    .await?;
    Ok(Some(events))
}

/// One step of an order's way through the saga: an event recorded, or a
/// consumer taking it (its inbox row; for fulfillment, which keeps none,
/// the shipment it created, caused by the event it took).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Stage {
    pub at: DateTime<Utc>,
    /// `recorded` or the consumer's name.
    pub by: String,
    /// The event's type name.
    pub event_type: String,
}

/// The steps of an order and its shipment, in time order, and the W3C
/// trace id its placement carried (what every service logs it under).
pub async fn stages(
    pool: &PgPool,
    order_id: Uuid,
) -> Result<(Vec<Stage>, Option<String>), StoreError> {
    let stages: Vec<Stage> = sqlx::query_as(
        "WITH ev AS (SELECT e.event_id, e.type, e.recorded_at FROM events e WHERE e.stream_id = $1 \
                     UNION ALL \
                     SELECT e.event_id, e.type, e.recorded_at FROM events e JOIN shipments s ON s.id = e.stream_id WHERE s.order_id = $1) \
         SELECT ev.recorded_at AS at, 'recorded' AS by, ev.type AS event_type FROM ev \
         UNION ALL \
         SELECT i.processed_at, i.consumer, ev.type FROM ev JOIN inbox i ON i.event_id = ev.event_id \
         UNION ALL \
         SELECT c.recorded_at, c.source, ev.type FROM shipments s \
           JOIN events c ON c.stream_id = s.id AND c.version = 1 \
           JOIN ev ON ev.event_id = c.causation_id \
         WHERE s.order_id = $1 \
           AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.source AND i.event_id = ev.event_id) \
         ORDER BY 1, 2",
    )
    .bind(order_id)
    .fetch_all(pool)
    .await?;
    let traceparent: Option<String> =
        sqlx::query_scalar("SELECT traceparent FROM events WHERE stream_id = $1 AND version = 1")
            .bind(order_id)
            .fetch_optional(pool)
            .await?
            .flatten();
    let trace_id = traceparent
        .and_then(|t| t.split('-').nth(1).map(str::to_owned))
        .filter(|t| t.len() == 32);
    Ok((stages, trace_id))
}

/// Folds an order's recorded events: the state the projection must equal.
pub fn fold_history(events: &[RecordedEvent]) -> Result<Option<Order>, StoreError> {
    let parsed: Vec<Event> = events
        .iter()
        .map(|e| Event::from_parts(&e.event_type, e.data.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("event: {e}")))?;
    Ok(domain::fold(&parsed))
}
