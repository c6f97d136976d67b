//! The inbox: one row per `(consumer, event id)` whose effect committed,
//! written in the effect's own transaction, so a redelivered event finds
//! its row and has no second effect. [`PgInbox`] is the PostgreSQL side of
//! [`events::Inbox`]; rows older than the retention are purged.

use crate::StoreError;
use events::{DeadLetter, Inbox};
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

/// The look-up behind [`Inbox::seen`]: which of the ids (`$2`) the
/// consumer (`$1`) has committed the effect of, one probe of the inbox's key
/// per id. Its statement runs inside a function that plans it at every call
/// on the table as it is then (migration `planned_at_each_call`), in one
/// round trip. Prepared, PostgreSQL may keep a generic plan made on the
/// statistics of the last `ANALYZE`: on a new system those say the inbox is
/// nearly empty, and the plan kept read every inbox row of the consumer at
/// each call until autovacuum analyzed the table again (0.6 ms a call over
/// 4,500 rows in `scripts/bench/statements.sh 10k 15`, which starts empty).
///
/// Each id is its own probe (`EXISTS … OFFSET 0` keeps it a subquery run
/// per id, on both columns of the key) rather than `event_id = ANY($2)`
/// beside `consumer = $1`: when the statistics were taken before the
/// consumer had rows, PostgreSQL counted a handful of rows for it and read
/// all of them, the ids as a filter (seen under `auto_explain` in
/// `statements.sh CLOSED=1`: 142 rows read for none found, more as the run
/// went on).
pub const SEEN_SQL: &str = "SELECT * FROM inbox_seen($1, $2)";

/// A consumer's transaction, opened with its inbox rows: a connection to
/// the handler (`&mut **tx`), and whether its commit waits for synchronous
/// standbys (read by its first statement, `replication::waits!`).
pub struct InboxTx {
    tx: Transaction<'static, Postgres>,
    waits: bool,
}

impl std::ops::Deref for InboxTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for InboxTx {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}

/// A consumer transaction's first statement: the batch's inbox rows (`$1`
/// the consumer, `$2` the event ids), the ids that were new, and whether
/// the commit will wait for synchronous standbys.
const BEGIN_SQL: &str = concat!(
    "WITH fresh AS (INSERT INTO inbox (consumer, event_id) \
         SELECT $1, id FROM unnest($2::uuid[]) AS t(id) ON CONFLICT DO NOTHING RETURNING event_id) \
     SELECT coalesce(array_agg(event_id), '{}'), ",
    crate::replication::waits!(),
    " FROM fresh"
);

/// A consumer transaction's first statement when it writes no inbox rows:
/// whether the commit will wait for synchronous standbys.
const BEGIN_WITHOUT_ROWS_SQL: &str = concat!("SELECT ", crate::replication::waits!());

/// [`events::Inbox`] over PostgreSQL: the inbox table and the dead letters.
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
    /// Whether each handled event leaves a row (see [`PgInbox::without_rows`]).
    rows: bool,
}

impl PgInbox {
    /// The inbox in the database behind `pool`.
    pub fn new(pool: PgPool) -> PgInbox {
        PgInbox { pool, rows: true }
    }

    /// An inbox that writes no rows, for a consumer whose every effect is
    /// keyed in its own tables so that handling an event twice changes
    /// nothing the second time (fulfillment: one shipment per order, by the
    /// shipments' unique order id). Every event counts as fresh, and a
    /// second delivery is handled again and finds its effect made; two
    /// deliveries handled at once meet on the effect's key, and the later
    /// transaction fails and is retried. What this saves is the inbox row
    /// and its index entry per event: about 260 bytes of WAL per order.
    /// Dead letters are kept as [`PgInbox::new`]'s are.
    pub fn without_rows(pool: PgPool) -> PgInbox {
        PgInbox { pool, rows: false }
    }
}

impl Inbox for PgInbox {
    type Tx = InboxTx;
    type Error = StoreError;

    async fn seen(&self, consumer: &str, event_ids: &[Uuid]) -> Result<Vec<bool>, StoreError> {
        if !self.rows {
            return Ok(vec![false; event_ids.len()]);
        }
        let seen: Vec<Uuid> = sqlx::query_scalar(SEEN_SQL)
            .bind(consumer)
            .bind(event_ids)
            .fetch_all(&self.pool)
            .await?;
        if !seen.is_empty() {
            // A row seen may be a commit the standbys never got: acking on it needs them to have it.
            let mut conn = self.pool.acquire().await?;
            crate::replication::confirm(&mut conn, "consumer").await?;
        }
        let seen: std::collections::HashSet<Uuid> = seen.into_iter().collect();
        Ok(event_ids.iter().map(|id| seen.contains(id)).collect())
    }

    async fn begin(
        &self,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> Result<(InboxTx, Vec<bool>), StoreError> {
        let mut tx = self.pool.begin().await?;
        if !self.rows {
            let waits: bool = sqlx::query_scalar(BEGIN_WITHOUT_ROWS_SQL)
                .fetch_one(&mut *tx)
                .await?;
            return Ok((InboxTx { tx, waits }, vec![true; event_ids.len()]));
        }
        let (fresh, waits): (Vec<Uuid>, bool) = sqlx::query_as(BEGIN_SQL)
            .bind(consumer)
            .bind(event_ids)
            .fetch_one(&mut *tx)
            .await?;
        let fresh: std::collections::HashSet<Uuid> = fresh.into_iter().collect();
        let is_fresh = event_ids.iter().map(|id| fresh.contains(id)).collect();
        Ok((InboxTx { tx, waits }, is_fresh))
    }

    /// Commits, then confirms the commit is on the synchronous standbys
    /// (when any are named): the caller acks only after this returns.
    async fn commit(&self, tx: InboxTx) -> Result<(), StoreError> {
        tx.tx.commit().await?;
        if !tx.waits {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        crate::replication::confirm_if(&mut conn, Some(true), "consumer").await
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
