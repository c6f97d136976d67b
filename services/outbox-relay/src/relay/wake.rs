//! The relay's wake-ups: one `LISTEN soldonce_outbox` for all its lanes,
//! each notification waking one idle lane, and each lane's own connection
//! for the looks it makes when no notification came.
//!
//! With a listener per lane, every notification woke every lane, and all
//! but the first claimed nothing: at a light load that was most of the
//! relay's claims (a transaction each). A notification wakes one lane now;
//! when every lane is busy it is kept (one, however many came) for the
//! first lane that is done.

use super::Relay;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Postgres};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// How long the listener waits before it connects again, once it could
/// not: meanwhile the lanes poll.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// Listens until `stop` turns true, waking one lane of `wake` per
/// notification. A row written while it was away is found by the lanes'
/// polls.
pub(super) async fn listen(pool: PgPool, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    loop {
        let connected = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            connected = connect(&pool) => connected,
        };
        match connected {
            Ok(mut listener) => loop {
                let got = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    got = listener.recv() => got,
                };
                match got {
                    Ok(_) => wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost; the lanes poll until it is back");
                        break;
                    }
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "could not LISTEN for outbox rows; the lanes poll until it can");
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(RECONNECT_AFTER) => {}
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen("soldonce_outbox").await?;
    Ok(listener)
}

/// Returns on a wake-up (`true`), or after `poll` (the fallback, `false`).
pub(super) async fn wait(wake: &Notify, poll: Duration) -> bool {
    tokio::time::timeout(poll, wake.notified()).await.is_ok()
}

impl Relay {
    /// Whether a claim by `lane` now could find anything: asked on the
    /// lane's own connection (taken from the pool once, and kept) in one
    /// statement ([`store::outbox::look`]) before a claim with no sign of
    /// new rows (a look while the lane holds the wake-up, or a poll), so a
    /// look that finds nothing costs no transaction. When the connection
    /// cannot be had, the look fails, or its server turns out to be a
    /// standby (a failover), the connection is let go and the claim is made.
    pub(super) async fn anything_to_claim(
        &self,
        lane: usize,
        conn: &mut Option<PoolConnection<Postgres>>,
    ) -> bool {
        if conn.is_none() {
            *conn = self.pool.acquire().await.ok();
        }
        let Some(c) = conn.as_mut() else {
            return true;
        };
        let waiting = match store::outbox::look(&mut **c, &self.held.others(lane)).await {
            Ok(look) if look.standby => {
                *conn = None;
                true
            }
            Ok(look) => look.waiting,
            Err(e) => {
                tracing::warn!(error = %e, "looking for outbox rows failed; claiming instead");
                *conn = None;
                true
            }
        };
        let found = if waiting { "rows" } else { "none" };
        metrics::counter!("soldonce_outbox_looks_total", "found" => found).increment(1);
        waiting
    }
}
