//! The relay loop: wake on NOTIFY (or the poll interval), drain the outbox
//! in batches, back off on errors, report backlog and lag.
//!
//! A row that can never be published (see [`crate::poison`]) is parked: in
//! the transaction that claimed it, it moves from `outbox` to
//! `outbox_parked` with its reason, so the rest of the batch and the next
//! row of its order go on. Anything else that fails (a timeout, a lost
//! connection, a refusal that concerns the whole stream) leaves the row in
//! the outbox to be retried; the rows of the batch that were acknowledged
//! are deleted all the same, so one failing row never holds the others.
//!
//! Its parts: the lanes here; their wake-ups and looks in `wake.rs`; a batch's steps in
//! `claim.rs`, `publish.rs` and `settle.rs`, timed by `lag.rs`; the backlog
//! gauges and the outbox's vacuum in `upkeep.rs`.

mod claim;
mod lag;
mod publish;
mod settle;
mod upkeep;
mod wake;

/// A claimed event for the relay's unit tests: in outbox row `row`, of
/// stream `stream`, at `position`.
#[cfg(test)]
fn test_event(row: i64, stream: sqlx::types::Uuid, position: i64) -> store::outbox::OutboxRow {
    store::outbox::OutboxRow {
        message: store::stream_copy::EventMessage {
            position,
            event_id: sqlx::types::Uuid::nil(),
            subject: "soldonce.order.test".into(),
            payload: "{}".into(),
            traceparent: None,
            tracestate: None,
        },
        row,
        stream_id: stream,
        created_at: chrono::Utc::now(),
    }
}

use crate::poison;
use crate::watch::{Acks, RepairSettings};
use async_nats::jetstream;
use backon::{ExponentialBuilder, Retryable};
use sqlx::PgPool;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// How long the outbox trigger's notifications are folded together (one
/// per 5 ms bucket, see the `outbox_wake` migration), with a margin.
const NOTIFY_WINDOW: Duration = Duration::from_millis(6);

/// While its drains keep finding rows, a lane holds the wake-up: it moves
/// the trigger's bucket this far ahead, so writers committing meanwhile send
/// no notification, and it looks again every [`LOOK_EVERY`] until the hold
/// has passed. A notification is a global lock in PostgreSQL: a notifying
/// transaction holds it from just before its commit until its commit record
/// is flushed, so notifying writers commit one at a time. Under load that
/// queued about a fifth of the writers' commits (sampled from
/// `pg_stat_activity` in the saga benchmark); with the hold, writers notify
/// only a relay that has gone quiet.
const HOLD: Duration = Duration::from_millis(50);

/// How often a lane holding the wake-up looks for rows. A look is one
/// statement on a connection the lane keeps; only a look that sees rows is
/// followed by a claim (`Relay::anything_to_claim`).
const LOOK_EVERY: Duration = Duration::from_millis(4);

/// Publishes outbox rows.
#[derive(Clone)]
pub struct Relay {
    pool: PgPool,
    js: jetstream::Context,
    batch_size: i64,
    poll_interval: Duration,
    lanes: usize,
    /// Vacuum the outbox once this many rows left it (0: never).
    vacuum_after: u64,
    /// Rows that left the outbox since the last vacuum, all lanes together.
    left_since_vacuum: Arc<AtomicU64>,
    /// What the lanes saw acknowledged, for the watch on the stream.
    acks: Arc<Acks>,
    /// What each lane holds in its open claim.
    held: Arc<claim::Held>,
    /// Wakes one idle lane per notification ([`wake::listen`]).
    wake: Arc<Notify>,
    repair: RepairSettings,
}

/// What one batch came to.
#[derive(Default)]
struct Batch {
    /// Events that left the outbox: published, or parked.
    settled: usize,
    /// Whether to claim again at once: the batch was full, or a row written
    /// after it was there when it committed.
    more: bool,
    /// The first failure worth retrying; its event stays in the outbox.
    failure: Option<anyhow::Error>,
}

impl Relay {
    /// A relay over this database and bus as `settings` say: `lanes` loops
    /// claiming and publishing at once (see [`Relay::run`]), a vacuum of the
    /// outbox after every `vacuum_after` rows it moved out (0: leaves that
    /// to autovacuum), and a watch that repairs the stream when it lost
    /// acknowledged messages (`crate::watch`).
    pub fn new(pool: PgPool, js: jetstream::Context, settings: &crate::Settings) -> Self {
        Relay {
            pool,
            js,
            batch_size: settings.batch_size,
            poll_interval: settings.poll_interval,
            lanes: settings.lanes.max(1),
            vacuum_after: settings.vacuum_after,
            left_since_vacuum: Arc::new(AtomicU64::new(0)),
            acks: Arc::new(Acks::default()),
            held: Arc::new(claim::Held::default()),
            wake: Arc::new(Notify::new()),
            repair: settings.repair,
        }
    }

    /// Relays until `stop` turns true. Each lane is a loop of its own
    /// (claim, publish, await the acks, delete, commit), woken by the
    /// relay's one listener when it is idle, so rows that commit while one
    /// lane awaits its acks are claimed by another instead of waiting for
    /// that batch to end. The lanes share the outbox as separate relays
    /// do: `SKIP LOCKED` keeps their batches apart, and a row whose order
    /// has an older row in another lane's batch is not claimable until
    /// that batch commits.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        for reason in poison::REASONS {
            metrics::counter!("soldonce_outbox_parked_total", "reason" => reason).increment(0);
        }
        let gauges = tokio::spawn(upkeep::report_backlog(self.pool.clone(), stop.clone()));
        let vacuum = (self.vacuum_after > 0).then(|| {
            tokio::spawn(upkeep::vacuum_outbox(
                self.pool.clone(),
                self.vacuum_after,
                self.left_since_vacuum.clone(),
                stop.clone(),
            ))
        });
        // The repair publishes pages of thousands before awaiting their acks:
        // on a context of its own, whose admitted acks the lanes do not share.
        let watch = tokio::spawn(crate::watch::run(
            self.pool.clone(),
            jetstream::new(self.js.client()),
            self.acks.clone(),
            self.repair,
            stop.clone(),
        ));
        let listener = tokio::spawn(wake::listen(
            self.pool.clone(),
            self.wake.clone(),
            stop.clone(),
        ));
        let lanes: Vec<_> = (0..self.lanes)
            .map(|lane| tokio::spawn(self.clone().lane(lane, stop.clone())))
            .collect();
        for lane in lanes {
            if let Err(e) = lane.await {
                tracing::error!(error = %e, "a relay lane ended abnormally");
            }
        }
        gauges.abort();
        watch.abort();
        listener.abort();
        if let Some(vacuum) = vacuum {
            vacuum.abort();
        }
    }

    /// Lane `lane`: drain on each wake-up until `stop` turns true. A
    /// notification is followed by a claim at once; a wake-up of the timer
    /// (a look while the lane holds the wake-up, a poll) first looks
    /// whether any row waits, and claims only if one does.
    async fn lane(self, lane: usize, mut stop: watch::Receiver<bool>) {
        // The connection this lane looks on, kept between looks.
        let mut looking = None;
        // Until when this lane holds the wake-up (and so must keep looking).
        let mut held_until: Option<Instant> = None;
        // Whether the last wait ended with no notification: then nothing says
        // rows were written, and the lane looks before it claims.
        let mut unprompted = false;
        loop {
            if *stop.borrow() {
                break;
            }
            let drained = if unprompted && !self.anything_to_claim(lane, &mut looking).await {
                Ok(0)
            } else {
                self.drain_retrying(lane).await
            };
            // The trigger notifies at most once per 5 ms, so a row committed
            // while a drain ran may have had its notification folded into one
            // already consumed: after a drain that moved rows, look again
            // once that window has passed rather than at the next poll.
            let now = Instant::now();
            let holding = held_until.is_some_and(|until| now < until);
            let wait = match drained {
                Ok(0) if holding => LOOK_EVERY.min(self.poll_interval),
                Ok(0) => self.poll_interval,
                Ok(_) => {
                    // Renewed once half of it has passed: a statement every ~25 ms, not per drain.
                    if held_until.is_none_or(|until| until < now + HOLD / 2) {
                        match store::outbox::hold_wake(&self.pool, HOLD).await {
                            // The hold ends on the database's clock; a bucket's margin covers the round trip.
                            Ok(()) => held_until = Some(Instant::now() + HOLD + NOTIFY_WINDOW),
                            Err(e) => tracing::debug!(error = %e, "could not hold the wake-up"),
                        }
                    }
                    if held_until.is_some_and(|until| now < until) {
                        LOOK_EVERY
                    } else {
                        NOTIFY_WINDOW
                    }
                    .min(self.poll_interval)
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "relaying keeps failing; waiting for the next wake-up");
                    self.poll_interval
                }
            };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                woken = wake::wait(&self.wake, wait) => unprompted = !woken,
            }
        }
    }

    /// [`Relay::drain`], retried with backoff while it fails.
    async fn drain_retrying(&self, lane: usize) -> anyhow::Result<usize> {
        (|| self.drain(lane))
            .retry(
                ExponentialBuilder::default()
                    .with_jitter()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(2))
                    .with_max_times(5),
            )
            .notify(|e: &anyhow::Error, after| {
                metrics::counter!("soldonce_outbox_publish_errors_total").increment(1);
                tracing::warn!(error = %format!("{e:#}"), ?after, "relaying failed; retrying");
            })
            .await
    }

    /// Publishes batches while there is likely more to claim: after a full
    /// batch, or one whose delete saw a row written after it. A batch that
    /// settled some rows and failed others is followed by the next (the
    /// failed rows are claimed again first); one that settled nothing
    /// returns its failure, for the caller to back off. Returns how many
    /// rows left the outbox.
    async fn drain(&self, lane: usize) -> anyhow::Result<usize> {
        let mut moved = 0;
        loop {
            let batch = self.relay_batch(lane).await?;
            moved += batch.settled;
            match (batch.settled, batch.failure) {
                (0, None) => return Ok(moved),
                // Nothing more seen: the lane's next look (within LOOK_EVERY while it
                // holds the wake-up, or the writers' notification) finds what commits next.
                (_, None) if !batch.more => return Ok(moved),
                (0, Some(e)) => return Err(e),
                (_, Some(e)) => {
                    metrics::counter!("soldonce_outbox_publish_errors_total").increment(1);
                    tracing::warn!(error = %format!("{e:#}"), "some rows of a batch failed; they will be retried");
                }
                (_, None) => {}
            }
        }
    }

    /// Claims one batch, publishes it, awaits every ack, then in the
    /// claiming transaction deletes the settled rows and parks the poison
    /// events.
    async fn relay_batch(&self, lane: usize) -> anyhow::Result<Batch> {
        let Some((tx, rows, keys)) = self.claim(lane).await? else {
            return Ok(Batch::default());
        };
        // Left out of the other lanes' claims until this batch's transaction ends.
        let _held = self.held.hold(lane, &keys);
        // Every new message must be acknowledged above this (see crate::watch).
        let floor = self.acks.floor();
        let sent = publish::publish(&self.js, &rows, publish::in_flight(self.lanes)).await;
        self.settle(tx, &rows, keys.len(), floor, sent).await
    }
}
