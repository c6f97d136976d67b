//! Settling: in the claiming transaction, the rows whose events were
//! acknowledged deleted and the poison events parked; then the commit, and
//! what it moved counted.

use super::publish::Sent;
use super::{Batch, Relay};
use sqlx::{Postgres, Transaction};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use store::outbox::OutboxRow;

impl Relay {
    /// Deletes the rows of the events `sent` saw acknowledged and parks the
    /// poison events in `tx` (the claiming transaction), commits, and says
    /// what the batch came to. `rows` are the batch's events, held by
    /// `claimed` outbox rows; `floor` is what the watch on the stream held
    /// before publishing.
    pub(super) async fn settle(
        &self,
        mut tx: Transaction<'static, Postgres>,
        rows: &[OutboxRow],
        claimed: usize,
        floor: u64,
        sent: Sent,
    ) -> anyhow::Result<Batch> {
        let Sent {
            published,
            sequences,
            parked,
            failure,
            hops: _hops,
        } = sent;
        if self.acks.note(floor, &sequences) {
            tracing::error!(
                floor,
                lowest = sequences.iter().min(),
                "JetStream acknowledged new messages at sequences it had already given: the stream lost messages it had acknowledged (its server restarted on an older store?); repairing it from the database"
            );
        }
        let full = i64::try_from(claimed).is_ok_and(|n| n >= self.batch_size);
        let mut more = full;
        let settled: HashSet<i64> = published
            .iter()
            .copied()
            .chain(parked.iter().map(|(i, _)| rows[*i].message.position))
            .collect();
        let (done, left) = settled_rows(rows, &settled);
        let mut deleted = 0;
        if !done.is_empty() {
            let last = done.iter().copied().max().unwrap_or_default();
            let d = store::outbox::delete(&mut tx, &done, last, &left).await?;
            more |= d.newer;
            deleted = d.rows;
        }
        let to_park: Vec<(&OutboxRow, &str)> =
            parked.iter().map(|(i, p)| (&rows[*i], p.reason)).collect();
        store::outbox::park(&mut tx, &to_park).await?;
        tx.commit().await?;
        self.left_since_vacuum.fetch_add(deleted, Ordering::Relaxed);
        metrics::counter!("soldonce_outbox_published_total").increment(published.len() as u64);
        for (i, p) in &parked {
            let row = &rows[*i];
            metrics::counter!("soldonce_outbox_parked_total", "reason" => p.reason).increment(1);
            tracing::error!(
                event_id = %row.message.event_id,
                subject = %row.message.subject,
                reason = p.reason,
                detail = %p.detail,
                "outbox row parked in outbox_parked: it can never be published; later events of its order go on without it"
            );
        }
        if !parked.is_empty() {
            if let Ok(n) = store::outbox::parked(&self.pool).await {
                metrics::gauge!("soldonce_outbox_parked").set(n as f64);
            }
        }
        Ok(Batch {
            settled: published.len() + parked.len(),
            more,
            failure,
        })
    }
}

/// Which rows of a batch go (those with an event settled), and which of
/// their events are written back as rows of their own (those not settled):
/// `(row keys, positions)`. A row none of whose events settled is left as
/// it is, for the next claim. `rows` are the batch's events in position
/// order.
fn settled_rows(rows: &[OutboxRow], settled: &HashSet<i64>) -> (Vec<i64>, Vec<i64>) {
    // Per row: its events not settled, and whether any was.
    let mut by_row: BTreeMap<i64, (Vec<i64>, bool)> = BTreeMap::new();
    for r in rows {
        let (unsettled, any) = by_row.entry(r.row).or_default();
        if settled.contains(&r.message.position) {
            *any = true;
        } else {
            unsettled.push(r.message.position);
        }
    }
    let mut done = Vec::new();
    let mut left = Vec::new();
    for (key, (unsettled, any)) in by_row {
        if any {
            done.push(key);
            left.extend(unsettled);
        }
    }
    (done, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::types::Uuid;

    #[test]
    fn a_row_goes_once_any_event_of_it_settled_and_leaves_the_others_behind() {
        // Rows 1 (1, 3, 5), 2 (2, 4) and 6 (6), their events interleaved by position.
        let rows: Vec<OutboxRow> = [(1, 1), (2, 2), (1, 3), (2, 4), (1, 5), (6, 6)]
            .into_iter()
            .map(|(row, position)| super::super::test_event(row, Uuid::nil(), position))
            .collect();
        // Row 1 all settled; row 2 in part; row 6 not at all (a failed ack).
        let settled: HashSet<i64> = [1, 3, 5, 4].into_iter().collect();
        assert_eq!(settled_rows(&rows, &settled), (vec![1, 2], vec![2]));
        assert_eq!(
            settled_rows(&rows, &HashSet::new()),
            (vec![], vec![]),
            "nothing settled: every row stays as it is"
        );
    }
}
