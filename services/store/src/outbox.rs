//! Reading and clearing the outbox for the relay. Rows are never read by an
//! increasing-id cursor: each claim looks at every unpublished row, so a
//! transaction that commits late is still seen. Only the oldest unpublished
//! row of each order is claimable, so one order's events leave in the order
//! they were recorded even with N relays.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// An unpublished event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: Uuid,
    pub subject: String,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// Locks up to `limit` publishable rows for this transaction; rows other
/// relays hold are skipped.
pub async fn claim(conn: &mut PgConnection, limit: i64) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.id, o.subject, o.payload, o.headers, o.created_at FROM outbox o \
         WHERE NOT EXISTS (SELECT 1 FROM outbox p WHERE p.stream_id = o.stream_id AND p.position < o.position) \
         ORDER BY o.position LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Deletes published rows.
pub async fn delete(conn: &mut PgConnection, ids: &[Uuid]) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query("DELETE FROM outbox WHERE id = ANY($1)").bind(ids).execute(conn).await?.rows_affected())
}

/// How many rows wait, and how old the oldest is in seconds.
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox",
    )
    .fetch_one(pool)
    .await
}
