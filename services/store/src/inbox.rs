//! The inbox: one row per `(consumer, event id)` whose effect committed,
//! written in the effect's own transaction, so a redelivered event finds
//! its row and has no second effect. [`PgInbox`] is the PostgreSQL side of
//! [`events::Inbox`]; rows older than the retention are purged.

use crate::StoreError;
use events::{DeadLetter, Inbox};
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

/// [`events::Inbox`] over PostgreSQL: the inbox table and the dead letters.
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
}

impl PgInbox {
    /// The inbox in the database behind `pool`.
    pub fn new(pool: PgPool) -> PgInbox {
        PgInbox { pool }
    }
}

impl Inbox for PgInbox {
    type Tx = Transaction<'static, Postgres>;
    type Error = StoreError;

    async fn seen(&self, consumer: &str, event_id: Uuid) -> Result<bool, StoreError> {
        let row: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM inbox WHERE consumer = $1 AND event_id = $2")
                .bind(consumer)
                .bind(event_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.is_some())
    }

    async fn begin(
        &self,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'static, Postgres>>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let fresh = sqlx::query(
            "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(event_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        Ok(fresh.then_some(tx))
    }

    async fn dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        crate::dead_letters::record(&self.pool, letter).await
    }
}

/// Deletes inbox rows older than `retention`; returns how many.
pub async fn purge(pool: &PgPool, retention: std::time::Duration) -> Result<u64, StoreError> {
    Ok(
        sqlx::query("DELETE FROM inbox WHERE processed_at < now() - make_interval(secs => $1)")
            .bind(retention.as_secs_f64())
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
