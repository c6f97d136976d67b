//! What the JetStream stream must hold, read from `events`, the authority.
//!
//! The stream is a copy: a broker that acknowledged messages still in its
//! page cache can lose them on power loss, after the relay deleted their
//! outbox rows. Every event that left the outbox (published, as far as
//! PostgreSQL knows; not waiting, not parked) must be on the stream; this
//! module lists them by position and rebuilds each one's message as the
//! relay sent it, for `bus::repair` to compare and republish. It never
//! talks to the bus.

use crate::StoreError;
use chrono::{DateTime, Utc};
use events::{envelope, names, Metadata};
use sqlx::PgPool;
use uuid::Uuid;

/// The message of one event: what the relay publishes and what a repair
/// republishes (the same subject, envelope and trace headers), built from
/// the event's one written copy in `events`.
#[derive(Debug, Clone)]
pub struct EventMessage {
    /// Its position in `events` (the `Soldonce-Position` header).
    pub position: i64,
    /// Its id (the `Nats-Msg-Id`, so JetStream and consumers dedupe it).
    pub event_id: Uuid,
    pub subject: String,
    /// The CloudEvent envelope as JSON text: the bytes published.
    pub payload: String,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl EventMessage {
    /// The message of the event recorded at `position` with these fields.
    pub(crate) fn of(
        position: i64,
        event_id: Uuid,
        stream_id: Uuid,
        type_name: &str,
        at: DateTime<Utc>,
        data: serde_json::Value,
        meta: &Metadata,
    ) -> Result<EventMessage, StoreError> {
        let wrapped = envelope::wrap(event_id, stream_id, type_name, at, data, meta);
        Ok(EventMessage {
            position,
            event_id,
            subject: names::subject(type_name, stream_id),
            payload: serde_json::to_string(&wrapped)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            traceparent: meta.traceparent.clone(),
            tracestate: meta.tracestate.clone(),
        })
    }
}

/// The first position of an event recorded at or after `at`, or one past
/// the last event if none was. `events` has no index on `recorded_at` (one
/// more entry to write per event, for a question asked only by repairs and
/// audits): positions grow with time but for late commits, so this is a
/// binary search over the primary key, a few dozen probes; callers step
/// back by a margin for the commits that overtook each other.
pub async fn first_position_at(pool: &PgPool, at: DateTime<Utc>) -> Result<i64, StoreError> {
    let (low, high): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT min(position), max(position) FROM events")
            .fetch_one(pool)
            .await?;
    let (Some(mut low), Some(high)) = (low, high) else {
        return Ok(1);
    };
    // Invariant: every position below `low` was recorded before `at`; `high + 1` is past them all.
    let mut high = high + 1;
    while low < high {
        let mid = low + (high - low) / 2;
        let found: Option<(i64, DateTime<Utc>)> = sqlx::query_as(
            "SELECT position, recorded_at FROM events WHERE position >= $1 ORDER BY position LIMIT 1",
        )
        .bind(mid)
        .fetch_optional(pool)
        .await?;
        match found {
            Some((position, recorded)) if recorded < at => low = position + 1,
            _ => high = mid,
        }
    }
    Ok(low)
}

/// When the event at `position` (or the first one after it) was recorded.
pub async fn recorded_at(
    pool: &PgPool,
    position: i64,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT recorded_at FROM events WHERE position >= $1 ORDER BY position LIMIT 1",
    )
    .bind(position)
    .fetch_optional(pool)
    .await?)
}

/// [`positions_of`]'s statement: the ids (`$1`) are found through the
/// BRIN index on `events.event_id` (migration 29), which holds a summary of
/// each range of pages: event ids rise with positions, so an id falls in
/// few ranges.
pub const POSITIONS_OF_SQL: &str = "SELECT position FROM events WHERE event_id = ANY($1)";

/// Positions of the events with these ids (messages the relay sent before
/// it stamped positions on them); ids that name no event are left out.
pub async fn positions_of(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<i64>, StoreError> {
    Ok(sqlx::query_scalar(POSITIONS_OF_SQL)
        .bind(ids)
        .fetch_all(pool)
        .await?)
}

/// The columns an event's message is built from, those of
/// [`StoredEvent`], as a literal for `concat!` (the relay's claim is a
/// constant too): `concat!("SELECT ", event_columns!(), " FROM events e …")`.
macro_rules! event_columns {
    () => {
        "e.position, e.event_id, e.stream_id, e.type, e.data, e.recorded_at, \
         e.correlation_id, e.causation_id, e.source, e.traceparent, e.tracestate"
    };
}
pub(crate) use event_columns;

/// An event as `events` holds it, read by `event_columns!()`.
#[derive(sqlx::FromRow)]
pub(crate) struct StoredEvent {
    pub position: i64,
    pub event_id: Uuid,
    pub stream_id: Uuid,
    #[sqlx(rename = "type")]
    pub kind: String,
    pub data: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
    pub correlation_id: Uuid,
    pub causation_id: Uuid,
    pub source: String,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl StoredEvent {
    /// Its message, as the relay publishes it.
    pub(crate) fn message(self) -> Result<EventMessage, StoreError> {
        let meta = Metadata {
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
            source: self.source,
            traceparent: self.traceparent,
            tracestate: self.tracestate,
        };
        EventMessage::of(
            self.position,
            self.event_id,
            self.stream_id,
            &self.kind,
            self.recorded_at,
            self.data,
            &meta,
        )
    }
}

/// The messages of the events at `positions`, in position order, rebuilt
/// from `events` as the write path built them.
pub async fn messages(pool: &PgPool, positions: &[i64]) -> Result<Vec<EventMessage>, StoreError> {
    let rows: Vec<StoredEvent> = sqlx::query_as(concat!(
        "SELECT ",
        event_columns!(),
        " FROM events e WHERE e.position = ANY($1) ORDER BY e.position"
    ))
    .bind(positions)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(StoredEvent::message).collect()
}
