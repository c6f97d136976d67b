//! The database's clock, read from any process: every time soldonce
//! records or compares (an order's `expires_at`, an event's time, the
//! moment a payment was learned) is on PostgreSQL's clock, never on the
//! clock of whichever host a service runs on. A host whose clock runs
//! minutes fast would otherwise release reservations minutes early, or
//! stamp events out of order with another host's.
//!
//! Each process measures how far its own clock is from the database's
//! when it connects (the middle of a `SELECT clock_timestamp()` round
//! trip, so the error is at most half a round trip) and again every
//! [`RESYNC_EVERY`]; [`now`] is its own clock plus that offset. Decisions
//! made inside one statement use the database's `now()` directly.

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use sqlx::PgPool;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// How often the offset is measured again (clocks drift; NTP steps them).
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// The database's clock minus this host's, in microseconds.
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// The database's current time as this process best knows it, at the
/// database's precision (microseconds), so an order folded from its events
/// equals the projection row to the byte.
pub fn now() -> DateTime<Utc> {
    let offset = TimeDelta::microseconds(OFFSET_MICROS.load(Ordering::Relaxed));
    (Utc::now() + offset).trunc_subsecs(6)
}

/// How far the database's clock is ahead of this host's (negative: behind).
pub fn offset() -> TimeDelta {
    TimeDelta::microseconds(OFFSET_MICROS.load(Ordering::Relaxed))
}

/// Measures the offset once, from one round trip on `pool`.
pub async fn sync(pool: &PgPool) -> Result<TimeDelta, sqlx::Error> {
    // The connection first: a wait for one must not count as round trip.
    let mut conn = pool.acquire().await?;
    let sent = Utc::now();
    let theirs: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await?;
    let received = Utc::now();
    let middle = sent + (received - sent) / 2;
    let offset = theirs - middle;
    let micros = offset.num_microseconds().unwrap_or(0);
    let before = OFFSET_MICROS.swap(micros, Ordering::Relaxed);
    if (micros - before).abs() > 1_000_000 {
        tracing::warn!(
            offset_ms = micros / 1000,
            "this host's clock is more than a second away from the database's; soldonce keeps time by the database's"
        );
    }
    metrics::gauge!("soldonce_clock_offset_seconds").set(micros as f64 / 1e6);
    Ok(offset)
}

/// Keeps the offset measured every [`RESYNC_EVERY`] while `pool` is open.
pub(crate) fn keep_synced(pool: PgPool) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RESYNC_EVERY).await;
            if pool.is_closed() {
                return;
            }
            if let Err(e) = sync(&pool).await {
                tracing::debug!(error = %e, "could not read the database's clock; keeping the last offset");
            }
        }
    });
}
