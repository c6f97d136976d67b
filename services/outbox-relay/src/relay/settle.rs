//! Settling: in the claiming transaction, the acknowledged rows deleted and
//! the poison ones parked; then the commit, and what it moved counted.

use super::publish::Sent;
use super::{Batch, Relay};
use sqlx::{Postgres, Transaction};
use std::sync::atomic::Ordering;
use store::outbox::OutboxRow;

impl Relay {
    /// Deletes the rows `sent` saw acknowledged and parks the poison ones in
    /// `tx` (the claiming transaction), commits, and says what the batch came
    /// to. `floor` is what the watch on the stream held before publishing.
    pub(super) async fn settle(
        &self,
        mut tx: Transaction<'static, Postgres>,
        rows: &[OutboxRow],
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
        let full = i64::try_from(rows.len()).is_ok_and(|n| n >= self.batch_size);
        let mut more = full;
        if !published.is_empty() {
            let last = rows
                .iter()
                .map(|r| r.message.position)
                .max()
                .unwrap_or_default();
            more |= store::outbox::delete(&mut tx, &published, last)
                .await?
                .newer;
        }
        let to_park: Vec<(&OutboxRow, &str)> =
            parked.iter().map(|(i, p)| (&rows[*i], p.reason)).collect();
        store::outbox::park(&mut tx, &to_park).await?;
        tx.commit().await?;
        self.left_since_vacuum
            .fetch_add((published.len() + parked.len()) as u64, Ordering::Relaxed);
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
