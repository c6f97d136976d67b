//! Dead letters: messages a consumer can never handle (an invalid envelope,
//! an unknown type or version, a message out of deliveries), kept with
//! their reason so an operator can read them and, once the cause is fixed,
//! redrive them (`bus::redrive`). A redriven letter keeps its row, stamped
//! `redriven_at`; only the others are outstanding (the audit counts them).

use crate::StoreError;
use chrono::{DateTime, Utc};
use events::DeadLetter;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

/// Keeps one dead letter.
pub async fn record(pool: &PgPool, letter: &DeadLetter) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO dead_letters (consumer, stream_seq, subject, payload, reason) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&letter.consumer)
    .bind(i64::try_from(letter.stream_seq).unwrap_or(-1))
    .bind(&letter.subject)
    .bind(&letter.payload)
    .bind(&letter.reason)
    .execute(pool)
    .await?;
    Ok(())
}

/// One kept dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Letter {
    pub id: i64,
    pub consumer: String,
    /// Where the message sat in the stream when it was given up on.
    pub stream_seq: Option<i64>,
    /// The subject it was delivered on (a redrive's subject, if it failed again after one).
    pub subject: String,
    /// The message exactly as delivered.
    #[serde(skip)]
    pub payload: Vec<u8>,
    pub reason: String,
    pub created_at: DateTime<Utc>,
    /// When it was sent to its consumer again, if it was.
    pub redriven_at: Option<DateTime<Utc>>,
}

/// Which letters a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These ids.
    Ids(Vec<i64>),
    /// Every letter of this consumer.
    Consumer(String),
    /// Every letter.
    All,
}

const COLUMNS: &str =
    "id, consumer, stream_seq, subject, payload, reason, created_at, redriven_at FROM dead_letters";

/// The newest `limit` letters (of `consumer`, when given), newest first;
/// redriven ones only with `include_redriven`.
pub async fn list(
    pool: &PgPool,
    consumer: Option<&str>,
    include_redriven: bool,
    limit: i64,
) -> Result<Vec<Letter>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} WHERE ($1::text IS NULL OR consumer = $1) \
           AND ($2 OR redriven_at IS NULL) ORDER BY id DESC LIMIT $3"
    ))
    .bind(consumer)
    .bind(include_redriven)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// The letters among `ids` that exist, redriven or not, in id order.
pub async fn find(pool: &PgPool, ids: &[i64]) -> Result<Vec<Letter>, StoreError> {
    Ok(
        sqlx::query_as(&format!("SELECT {COLUMNS} WHERE id = ANY($1) ORDER BY id"))
            .bind(ids)
            .fetch_all(pool)
            .await?,
    )
}

/// Every consumer that has ever dead-lettered a message, by name.
pub async fn consumers(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT DISTINCT consumer FROM dead_letters ORDER BY consumer")
            .fetch_all(pool)
            .await?,
    )
}

/// The selected letters not yet redriven, locked for the caller's
/// transaction, in id order. A second redrive running at the same time
/// waits here, then finds them redriven and takes none.
pub async fn lock_outstanding(
    conn: &mut PgConnection,
    selection: &Selection,
) -> Result<Vec<Letter>, StoreError> {
    let (ids, consumer): (Option<&[i64]>, Option<&str>) = match selection {
        Selection::Ids(ids) => (Some(ids), None),
        Selection::Consumer(c) => (None, Some(c)),
        Selection::All => (None, None),
    };
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} WHERE redriven_at IS NULL \
           AND ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR consumer = $2) \
         ORDER BY id FOR UPDATE"
    ))
    .bind(ids)
    .bind(consumer)
    .fetch_all(conn)
    .await?)
}

/// Stamps letters as redriven, in the caller's transaction.
pub async fn mark_redriven(conn: &mut PgConnection, ids: &[i64]) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE dead_letters SET redriven_at = now() WHERE id = ANY($1) AND redriven_at IS NULL",
    )
    .bind(ids)
    .execute(conn)
    .await?
    .rows_affected())
}
