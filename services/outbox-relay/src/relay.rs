//! The relay loop: wake on NOTIFY (or the poll interval), drain the outbox
//! in batches, back off on errors, report backlog and lag.

use async_nats::jetstream::{self, message::PublishMessage};
use backon::{ExponentialBuilder, Retryable};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::time::Duration;
use tokio::sync::watch;

/// Publishes outbox rows.
pub struct Relay {
    pool: PgPool,
    js: jetstream::Context,
    batch_size: i64,
    poll_interval: Duration,
}

impl Relay {
    /// A relay over this database and bus.
    pub fn new(pool: PgPool, js: jetstream::Context, batch_size: i64, poll_interval: Duration) -> Self {
        Relay { pool, js, batch_size, poll_interval }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Relays until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut listener = listen(&self.pool).await;
        let gauges = tokio::spawn(report_backlog(self.pool.clone(), stop.clone()));
        loop {
            if *stop.borrow() {
                break;
            }
            let drained = (|| self.drain()).retry(ExponentialBuilder::default().with_jitter().with_min_delay(Duration::from_millis(50)).with_max_delay(Duration::from_secs(2)).with_max_times(5)).notify(|e: &anyhow::Error, after| {
                metrics::counter!("soldonce_outbox_publish_errors_total").increment(1);
                tracing::warn!(error = %format!("{e:#}"), ?after, "relaying failed; retrying");
            }).await;
            if let Err(e) = drained {
                tracing::error!(error = %format!("{e:#}"), "relaying keeps failing; waiting for the next wake-up");
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                () = wait_for_notification(&mut listener, self.poll_interval) => {}
            }
            if listener.is_none() {
                listener = listen(&self.pool).await;
            }
        }
        gauges.abort();
    }

    /// Publishes batches until the outbox has nothing claimable.
    async fn drain(&self) -> anyhow::Result<()> {
        while self.relay_batch().await? > 0 {}
        Ok(())
    }

    /// Claims one batch, publishes it, awaits every ack, deletes it; returns its size.
    async fn relay_batch(&self) -> anyhow::Result<usize> {
        let mut tx = self.pool.begin().await?;
        let rows = store::outbox::claim(&mut tx, self.batch_size).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let payload = serde_json::to_vec(&row.payload)?;
            // `message_id` adds a header; `headers()` would replace them all.
            let mut publish = PublishMessage::build().payload(payload.into()).message_id(row.id.to_string());
            if let Some(tp) = row.headers.get("traceparent").and_then(|v| v.as_str()) {
                publish = publish.header("traceparent", tp);
            }
            pending.push(self.js.send_publish(row.subject.clone(), publish).await?);
        }
        for (row, ack) in rows.iter().zip(pending) {
            let ack = ack.await?;
            if ack.duplicate {
                metrics::counter!("soldonce_outbox_duplicates_total").increment(1);
            }
            let lag = (chrono::Utc::now() - row.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
            metrics::histogram!("soldonce_outbox_commit_to_puback_seconds").record(lag.max(0.0));
        }
        let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.id).collect();
        store::outbox::delete(&mut tx, &ids).await?;
        tx.commit().await?;
        metrics::counter!("soldonce_outbox_published_total").increment(rows.len() as u64);
        Ok(rows.len())
    }
}

async fn listen(pool: &PgPool) -> Option<PgListener> {
    let mut listener = PgListener::connect_with(pool).await.ok()?;
    listener.listen("soldonce_outbox").await.ok()?;
    Some(listener)
}

/// Returns on a notification, or after `poll` (the fallback). A broken
/// listener is dropped so the loop reconnects it.
async fn wait_for_notification(listener: &mut Option<PgListener>, poll: Duration) {
    let Some(l) = listener.as_mut() else {
        tokio::time::sleep(poll).await;
        return;
    };
    match tokio::time::timeout(poll, l.recv()).await {
        Ok(Ok(_)) | Err(_) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "LISTEN connection lost; polling until it is back");
            *listener = None;
        }
    }
}

async fn report_backlog(pool: PgPool, mut stop: watch::Receiver<bool>) {
    loop {
        if let Ok((rows, oldest)) = store::outbox::backlog(&pool).await {
            metrics::gauge!("soldonce_outbox_backlog").set(rows as f64);
            metrics::gauge!("soldonce_outbox_oldest_unpublished_seconds").set(oldest);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
