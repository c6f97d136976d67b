//! Claiming: a batch of outbox rows taken in a transaction of its own, and
//! held back until no failover could take them back.

use super::lag::seconds_between;
use super::Relay;
use sqlx::{Postgres, Transaction};
use store::outbox::OutboxRow;

impl Relay {
    /// Claims the next batch in a new transaction, which later deletes or
    /// parks its rows; `None` when the outbox has nothing to claim.
    pub(super) async fn claim(
        &self,
    ) -> anyhow::Result<Option<(Transaction<'static, Postgres>, Vec<OutboxRow>)>> {
        let mut tx = self.pool.begin().await?;
        let store::outbox::Claimed {
            rows,
            needs_replication,
        } = store::outbox::claim(&mut tx, self.batch_size).await?;
        if rows.is_empty() {
            return Ok(None);
        }
        // The first part of each row's commit → PubAck lag: how long it waited to be claimed.
        let claimed_at = chrono::Utc::now();
        let waited = metrics::histogram!("soldonce_outbox_commit_to_claim_seconds");
        for row in &rows {
            waited.record(seconds_between(row.created_at, claimed_at));
        }
        // Nothing leaves for the bus that a failover could still take back.
        if needs_replication {
            store::outbox::await_replication(&self.pool).await?;
        }
        Ok(Some((tx, rows)))
    }
}
