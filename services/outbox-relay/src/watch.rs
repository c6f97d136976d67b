//! The relay's watch on the stream: it notices when JetStream lost
//! messages it had acknowledged and has them republished from `events`
//! ([`bus::repair`]).
//!
//! A healthy stream gives every new message a sequence above every
//! sequence acknowledged before it was sent. So each batch notes the
//! highest sequence the relay had seen acknowledged before it sent
//! anything (its floor); a new message (not a duplicate) acknowledged at or
//! below that floor proves the stream went back: its server restarted on
//! an older copy of its store (a power loss with acknowledged messages
//! still in the page cache, a restored backup). A stream whose last
//! sequence is below the highest acknowledged one, seen every
//! `check_every` while nothing is published, proves the same. Either way
//! the events recorded since shortly before the relay's last acknowledgment
//! from before the loss are compared with the stream and what it lacks is
//! republished. At start the relay compares the window before the stream's
//! last message too: a power loss usually takes the relay down as well.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// How the relay repairs the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairSettings {
    /// `STREAM_REPAIR_LOOKBACK`, default 5 minutes (0: no automatic repair):
    /// how far before its last acknowledgment from before a loss the relay
    /// compares. It must cover the broker's unsynced window (NATS's
    /// `sync_interval`, 2 minutes by default) and how long an event can
    /// wait in the outbox.
    pub lookback: Duration,
    /// `STREAM_REPAIR_CHECK_INTERVAL`, default 5 s: how often the relay
    /// compares the stream's last sequence with what it saw acknowledged.
    pub check_every: Duration,
}

impl Default for RepairSettings {
    fn default() -> Self {
        RepairSettings {
            lookback: Duration::from_secs(300),
            check_every: Duration::from_secs(5),
        }
    }
}

/// What the relay's lanes saw acknowledged, shared with the watch.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    /// The highest stream sequence acknowledged for a new message.
    highest: AtomicU64,
    /// When the last batch was acknowledged with no sign of a loss.
    last_good: Mutex<Option<DateTime<Utc>>>,
    /// The earliest acknowledgment time a pending repair must reach back to.
    repair_from: Mutex<Option<DateTime<Utc>>>,
    wake: Notify,
}

impl Acks {
    /// The floor a batch compares its acknowledgments with: read before it sends.
    pub(crate) fn floor(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }

    /// Notes a batch's acknowledgments of new messages (their sequences),
    /// sent when the highest acknowledged sequence was `floor`. Returns
    /// whether they prove the stream lost messages.
    pub(crate) fn note(&self, floor: u64, sequences: &[u64]) -> bool {
        let Some(&max) = sequences.iter().max() else {
            return false;
        };
        let lost = sequences.iter().any(|&s| s <= floor);
        if lost {
            self.lost();
        } else if let Ok(mut at) = self.last_good.lock() {
            *at = Some(Utc::now());
        }
        self.highest.fetch_max(max, Ordering::AcqRel);
        lost
    }

    /// Asks the watch for a repair back from the last good acknowledgment.
    fn lost(&self) {
        let from = self.last_good.lock().ok().and_then(|at| *at);
        if let Ok(mut pending) = self.repair_from.lock() {
            let from = from.unwrap_or_else(Utc::now);
            *pending = Some(pending.map_or(from, |p| p.min(from)));
        }
        metrics::counter!("soldonce_stream_losses_detected_total").increment(1);
        self.wake.notify_one();
    }
}

/// Watches the stream until `stop`: a repair at start, then one each time
/// a loss is seen (by a lane, or by the periodic look at the stream).
pub(crate) async fn run(
    pool: PgPool,
    js: async_nats::jetstream::Context,
    acks: Arc<Acks>,
    settings: RepairSettings,
    mut stop: watch::Receiver<bool>,
) {
    metrics::counter!("soldonce_stream_losses_detected_total").increment(0);
    metrics::counter!("soldonce_stream_republished_total").increment(0);
    if settings.lookback.is_zero() {
        return;
    }
    let lookback = chrono::TimeDelta::from_std(settings.lookback).unwrap_or(chrono::TimeDelta::MAX);
    // At start: the window before the stream's last message.
    let mut pending = Some(match last_message_time(&js).await {
        Some(t) => t,
        None => Utc::now(),
    });
    loop {
        if let Some(anchor) = pending.take() {
            let since = bus::repair::Since::Time(anchor - lookback);
            match bus::repair::repair(&pool, &js, since, false).await {
                Ok(r) if r.missing > 0 => tracing::error!(
                    missing = r.missing,
                    first_missing = r.first_missing,
                    republished = r.republished,
                    seconds = r.seconds,
                    "the stream had lost events it had acknowledged; republished them from the database"
                ),
                Ok(r) => tracing::info!(
                    expected = r.expected,
                    scanned = r.scanned,
                    seconds = r.seconds,
                    "the stream holds every event of the repair window"
                ),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "repairing the stream failed; trying again");
                    pending = Some(anchor);
                }
            }
        }
        let wait = if pending.is_some() {
            Duration::from_secs(1)
        } else {
            settings.check_every
        };
        let looked = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = acks.wake.notified() => false,
            () = tokio::time::sleep(wait) => true,
        };
        if looked && stream_went_back(&js, &acks).await {
            acks.lost();
        }
        let asked = acks.repair_from.lock().ok().and_then(|mut p| p.take());
        if let Some(from) = asked {
            pending = Some(pending.map_or(from, |p| p.min(from)));
        }
        if pending.is_some() {
            // Messages acknowledged from here on are measured against the stream as it is now.
            if let Some(last) = last_sequence(&js).await {
                acks.highest.store(last, Ordering::Release);
            }
        }
    }
}

/// Whether the stream's last sequence is below the highest the relay saw acknowledged.
async fn stream_went_back(js: &async_nats::jetstream::Context, acks: &Acks) -> bool {
    let highest = acks.highest.load(Ordering::Acquire);
    match last_sequence(js).await {
        Some(last) => last < highest,
        None => false,
    }
}

async fn last_sequence(js: &async_nats::jetstream::Context) -> Option<u64> {
    let mut stream = js.get_stream(bus::STREAM).await.ok()?;
    Some(stream.info().await.ok()?.state.last_sequence)
}

async fn last_message_time(js: &async_nats::jetstream::Context) -> Option<DateTime<Utc>> {
    let mut stream = js.get_stream(bus::STREAM).await.ok()?;
    let state = &stream.info().await.ok()?.state;
    (state.messages > 0).then_some(state.last_timestamp)
}
