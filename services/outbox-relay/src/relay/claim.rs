//! Claiming: a batch of outbox rows taken in a transaction of its own, and
//! held back until no failover could take them back.

use super::lag::seconds_between;
use super::Relay;
use sqlx::{Postgres, Transaction};
use std::collections::HashMap;
use std::sync::Mutex;
use store::outbox::OutboxRow;

/// The outbox rows (their keys) each lane of this relay holds in its open
/// claim. A lane's
/// claim leaves the other lanes' rows out before it looks anything up for
/// them: they are locked, and `SKIP LOCKED` skips a row only after the
/// claim has probed its event and the version before it, so a lane's claim
/// walked the other lane's whole batch, most often to come back empty.
#[derive(Debug, Default)]
pub(super) struct Held {
    by_lane: Mutex<HashMap<usize, Vec<i64>>>,
}

impl Held {
    /// What the lanes other than `lane` hold.
    pub(super) fn others(&self, lane: usize) -> Vec<i64> {
        let by_lane = self.by_lane.lock().unwrap_or_else(|e| e.into_inner());
        by_lane
            .iter()
            .filter(|(l, _)| **l != lane)
            .flat_map(|(_, positions)| positions.iter().copied())
            .collect()
    }

    /// Notes that `lane` holds the outbox rows keyed `keys` until the
    /// returned guard is dropped (once its transaction has ended).
    pub(super) fn hold(&self, lane: usize, keys: &[i64]) -> HeldBy<'_> {
        let positions = keys.to_vec();
        self.by_lane
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lane, positions);
        HeldBy { held: self, lane }
    }
}

/// A lane's rows noted in [`Held`], forgotten when dropped.
pub(super) struct HeldBy<'a> {
    held: &'a Held,
    lane: usize,
}

impl Drop for HeldBy<'_> {
    fn drop(&mut self) {
        self.held
            .by_lane
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.lane);
    }
}

impl Relay {
    /// Claims the next batch for `lane` in a new transaction, which later
    /// deletes its rows and parks poison events; `None` when the outbox has
    /// nothing to claim. Returns the batch's events and the keys of the rows
    /// that hold them.
    pub(super) async fn claim(
        &self,
        lane: usize,
    ) -> anyhow::Result<Option<(Transaction<'static, Postgres>, Vec<OutboxRow>, Vec<i64>)>> {
        let mut tx = self.pool.begin().await?;
        let others = self.held.others(lane);
        let store::outbox::Claimed {
            rows,
            keys,
            needs_replication,
        } = store::outbox::claim(&mut tx, self.batch_size, &others).await?;
        let found = if rows.is_empty() { "none" } else { "rows" };
        metrics::counter!("soldonce_outbox_claims_total", "found" => found).increment(1);
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
        Ok(Some((tx, rows, keys)))
    }
}
