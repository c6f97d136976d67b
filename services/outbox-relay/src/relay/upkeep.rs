//! Upkeep beside the lanes: the outbox's backlog gauges, and its vacuum
//! after enough rows have left it.

use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the relay looks whether it has deleted enough rows to vacuum
/// the outbox (see [`store::outbox::vacuum`]).
const VACUUM_LOOK_EVERY: Duration = Duration::from_secs(1);

/// Vacuums the outbox each time `after` rows have left it (checked every
/// [`VACUUM_LOOK_EVERY`]), while this role may; see [`store::outbox::vacuum`].
pub(super) async fn vacuum_outbox(
    pool: PgPool,
    after: u64,
    left: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    metrics::counter!("soldonce_outbox_vacuums_total").increment(0);
    // Whether this role may vacuum is asked once, when the first vacuum is due.
    let mut allowed = false;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(VACUUM_LOOK_EVERY) => {}
        }
        if left.load(Ordering::Relaxed) < after {
            continue;
        }
        if !allowed {
            match store::outbox::can_vacuum(&pool).await {
                Ok(true) => allowed = true,
                Ok(false) => {
                    tracing::warn!(
                        "this database role may not VACUUM the outbox (it is neither the table's nor the database's owner): \
                         the relay leaves it to autovacuum; under load, set a low autovacuum_naptime, or give the relay the owner's role"
                    );
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not learn whether the outbox may be vacuumed");
                    continue;
                }
            }
        }
        let started = Instant::now();
        match store::outbox::vacuum(&pool).await {
            Ok(()) => {
                left.store(0, Ordering::Relaxed);
                metrics::counter!("soldonce_outbox_vacuums_total").increment(1);
                metrics::histogram!("soldonce_outbox_vacuum_seconds")
                    .record(started.elapsed().as_secs_f64());
            }
            Err(e) => tracing::warn!(error = %e, "vacuuming the outbox failed; trying again later"),
        }
    }
}

/// Reports the outbox's backlog, the age of its oldest unpublished row and
/// its parked rows, every second until `stop` turns true.
pub(super) async fn report_backlog(pool: PgPool, mut stop: watch::Receiver<bool>) {
    loop {
        if let Ok((rows, oldest)) = store::outbox::backlog(&pool).await {
            metrics::gauge!("soldonce_outbox_backlog").set(rows as f64);
            metrics::gauge!("soldonce_outbox_oldest_unpublished_seconds").set(oldest);
        }
        if let Ok(parked) = store::outbox::parked(&pool).await {
            metrics::gauge!("soldonce_outbox_parked").set(parked as f64);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
