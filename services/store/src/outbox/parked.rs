//! Parked rows: the events the relay can never publish, set aside in
//! `outbox_parked` with the message it built and why it was refused, for an
//! operator to list and, once the cause is fixed, to requeue.

use super::OutboxRow;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Sets aside events that can never be published, each with its short
/// reason (`too_large`, `bad_subject`, `rejected`), in `outbox_parked`, in
/// one statement, in the caller's transaction (the one that claimed them;
/// its [`super::delete`] takes their outbox rows away). The parked row keeps
/// the message as the relay built it: what was refused. Returns how many
/// were parked. An event parked again (an operator requeued it and it still
/// fails) replaces its old record.
pub async fn park(
    conn: &mut PgConnection,
    rows: &[(&OutboxRow, &str)],
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0.message.event_id).collect();
    let positions: Vec<i64> = rows.iter().map(|r| r.0.message.position).collect();
    let streams: Vec<Uuid> = rows.iter().map(|r| r.0.stream_id).collect();
    let subjects: Vec<&str> = rows.iter().map(|r| r.0.message.subject.as_str()).collect();
    let payloads: Vec<&str> = rows.iter().map(|r| r.0.message.payload.as_str()).collect();
    let headers: Vec<serde_json::Value> = rows.iter().map(|r| r.0.headers()).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.0.created_at).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.1).collect();
    let moved = sqlx::query(
        "INSERT INTO outbox_parked (id, position, stream_id, subject, payload, headers, created_at, reason) \
         SELECT p.id, p.position, p.stream_id, p.subject, p.payload::json, p.headers, p.created_at, p.reason \
         FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::jsonb[], $7::timestamptz[], $8::text[]) \
              AS p(id, position, stream_id, subject, payload, headers, created_at, reason) \
         ON CONFLICT (id) DO UPDATE SET position = EXCLUDED.position, stream_id = EXCLUDED.stream_id, \
             subject = EXCLUDED.subject, payload = EXCLUDED.payload, headers = EXCLUDED.headers, \
             created_at = EXCLUDED.created_at, reason = EXCLUDED.reason, parked_at = now()",
    )
    .bind(&ids)
    .bind(&positions)
    .bind(&streams)
    .bind(&subjects)
    .bind(&payloads)
    .bind(&headers)
    .bind(&created)
    .bind(&reasons)
    .execute(conn)
    .await?;
    Ok(moved.rows_affected())
}

/// How many rows are parked (the `soldonce_outbox_parked` gauge).
pub async fn parked(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_parked")
        .fetch_one(pool)
        .await?;
    Ok(n)
}

/// A row the relay set aside, for an operator to read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ParkedRow {
    /// The event's id (its `Nats-Msg-Id`).
    pub id: Uuid,
    /// The event's position in `events`.
    pub position: i64,
    /// The aggregate it belongs to (the order, or the shipment).
    pub stream_id: Uuid,
    pub subject: String,
    /// `too_large`, `bad_subject` or `rejected`.
    pub reason: String,
    /// The message's size in bytes.
    pub bytes: i32,
    pub parked_at: DateTime<Utc>,
}

/// The parked rows, oldest first, at most `limit`.
pub async fn parked_rows(pool: &PgPool, limit: i64) -> Result<Vec<ParkedRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, position, stream_id, subject, reason, octet_length(payload::text) AS bytes, parked_at \
         FROM outbox_parked ORDER BY parked_at, position LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Which of `ids` are parked, and which of the others are events at all:
/// `(parked, known events not parked)`; an id in neither is unknown.
pub async fn classify_ids(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<(Vec<Uuid>, Vec<Uuid>), sqlx::Error> {
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT k.id, EXISTS (SELECT 1 FROM outbox_parked p WHERE p.id = k.id) \
         FROM unnest($1::uuid[]) AS k(id) \
         WHERE EXISTS (SELECT 1 FROM outbox_parked p WHERE p.id = k.id) \
            OR EXISTS (SELECT 1 FROM events e WHERE e.event_id = k.id)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    let (parked, known): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(_, parked)| *parked);
    Ok((
        parked.into_iter().map(|(id, _)| id).collect(),
        known.into_iter().map(|(id, _)| id).collect(),
    ))
}

/// What [`requeue`] moved, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// The events moved back into the outbox (with `dry_run`: that would be).
    pub moved: Vec<Uuid>,
    /// Parked rows with no event at their position in `events` (set aside
    /// as `no_event` by the upgrade that made outbox rows references):
    /// there is nothing to publish them from, so they stay parked.
    pub no_event: Vec<Uuid>,
}

/// Moves parked rows (those of `ids`, or all with `None`) back into the
/// outbox in one statement, each as a row of its own at its event's
/// position, with the transaction that wrote the event, so it leaves
/// before any later row of its order still waiting; the insert wakes the
/// relay, which builds the message from the event again. Its `created_at`
/// is now: the requeue is the commit it is published after. A row already
/// moved by another requeue is not there to move again. With `dry_run`
/// nothing moves.
pub async fn requeue(
    pool: &PgPool,
    ids: Option<&[Uuid]>,
    dry_run: bool,
) -> Result<Requeued, sqlx::Error> {
    const WANTED: &str = "($1::uuid[] IS NULL OR p.id = ANY($1))";
    const HAS_EVENT: &str =
        "EXISTS (SELECT 1 FROM events e WHERE e.position = p.position AND e.event_id = p.id)";
    let no_event: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT p.id FROM outbox_parked p WHERE {WANTED} AND NOT {HAS_EVENT} ORDER BY p.position"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?;
    let moved = if dry_run {
        format!(
            "SELECT p.id FROM outbox_parked p WHERE {WANTED} AND {HAS_EVENT} ORDER BY p.position"
        )
    } else {
        format!(
            "WITH moved AS ( \
                 DELETE FROM outbox_parked p WHERE {WANTED} AND {HAS_EVENT} \
                 RETURNING id, position, stream_id), \
             queued AS ( \
                 INSERT INTO outbox (position, positions, tx, created_at) \
                 SELECT m.position, ARRAY[m.position], e.xmin::text::bigint, now() \
                 FROM moved m JOIN events e ON e.position = m.position RETURNING position) \
             SELECT m.id FROM moved m JOIN queued q ON q.position = m.position ORDER BY m.position"
        )
    };
    let moved = sqlx::query_scalar(&moved).bind(ids).fetch_all(pool).await?;
    Ok(Requeued { moved, no_event })
}
