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

use crate::poison::{self, Poison};
use crate::watch::{Acks, RepairSettings};
use async_nats::jetstream::{self, message::PublishMessage};
use backon::{ExponentialBuilder, Retryable};
use platform::otel::{Hop, Kind};
use platform::trace::TraceParent;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

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

/// How often a lane holding the wake-up looks for rows.
const LOOK_EVERY: Duration = Duration::from_millis(4);

/// How often the relay looks whether it has deleted enough rows to vacuum
/// the outbox (see [`store::outbox::vacuum`]).
const VACUUM_LOOK_EVERY: Duration = Duration::from_secs(1);

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
    repair: RepairSettings,
}

/// What one batch came to.
#[derive(Default)]
struct Batch {
    /// Rows that left the outbox: published, or parked.
    settled: usize,
    /// Whether to claim again at once: the batch was full, or a row written
    /// after it was there when it committed.
    more: bool,
    /// The first failure worth retrying; its row stays in the outbox.
    failure: Option<anyhow::Error>,
}

impl Relay {
    /// A relay over this database and bus as `settings` say: `lanes` loops
    /// claiming and publishing at once (see [`Relay::run`]), a vacuum of the
    /// outbox after every `vacuum_after` rows it moved out (0: leaves that
    /// to autovacuum), and a watch that repairs the stream when it lost
    /// acknowledged messages ([`crate::watch`]).
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
            repair: settings.repair,
        }
    }

    /// Relays until `stop` turns true. Each lane is a loop of its own
    /// (claim, publish, await the acks, delete, commit) with its own
    /// listener, so rows that commit while one lane awaits its acks are
    /// claimed by another instead of waiting for that batch to end. The
    /// lanes share the outbox as separate relays do: `SKIP LOCKED` keeps
    /// their batches apart, and a row whose order has an older row in
    /// another lane's batch is not claimable until that batch commits.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        for reason in poison::REASONS {
            metrics::counter!("soldonce_outbox_parked_total", "reason" => reason).increment(0);
        }
        let gauges = tokio::spawn(report_backlog(self.pool.clone(), stop.clone()));
        let vacuum = (self.vacuum_after > 0).then(|| {
            tokio::spawn(vacuum_outbox(
                self.pool.clone(),
                self.vacuum_after,
                self.left_since_vacuum.clone(),
                stop.clone(),
            ))
        });
        let watch = tokio::spawn(crate::watch::run(
            self.pool.clone(),
            self.js.clone(),
            self.acks.clone(),
            self.repair,
            stop.clone(),
        ));
        let lanes: Vec<_> = (0..self.lanes)
            .map(|_| tokio::spawn(self.clone().lane(stop.clone())))
            .collect();
        for lane in lanes {
            if let Err(e) = lane.await {
                tracing::error!(error = %e, "a relay lane ended abnormally");
            }
        }
        gauges.abort();
        watch.abort();
        if let Some(vacuum) = vacuum {
            vacuum.abort();
        }
    }

    /// One lane: drain on each wake-up until `stop` turns true.
    async fn lane(self, mut stop: watch::Receiver<bool>) {
        let mut listener = listen(&self.pool).await;
        // Until when this lane holds the wake-up (and so must keep looking).
        let mut held_until: Option<Instant> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            let drained = (|| self.drain())
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
                .await;
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
                () = wait_for_notification(&mut listener, wait) => {}
            }
            if listener.is_none() {
                listener = listen(&self.pool).await;
            }
        }
    }

    /// Publishes batches while there is likely more to claim: after a full
    /// batch, or one whose delete saw a row written after it. A batch that
    /// settled some rows and failed others is followed by the next (the
    /// failed rows are claimed again first); one that settled nothing
    /// returns its failure, for the caller to back off. Returns how many
    /// rows left the outbox.
    async fn drain(&self) -> anyhow::Result<usize> {
        let mut moved = 0;
        loop {
            let batch = self.relay_batch().await?;
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
    /// claiming transaction deletes the acknowledged rows and parks the
    /// poison ones.
    async fn relay_batch(&self) -> anyhow::Result<Batch> {
        let mut tx = self.pool.begin().await?;
        let store::outbox::Claimed {
            rows,
            needs_replication,
        } = store::outbox::claim(&mut tx, self.batch_size).await?;
        if rows.is_empty() {
            return Ok(Batch::default());
        }
        // The first part of each row's commit → PubAck lag: how long it waited to be claimed.
        let claimed_at = chrono::Utc::now();
        let waited = metrics::histogram!("soldonce_outbox_commit_to_claim_seconds");
        for row in &rows {
            waited.record(seconds_between(row.created_at, claimed_at));
        }
        let lag = metrics::histogram!("soldonce_outbox_commit_to_puback_seconds");
        // Nothing leaves for the bus that a failover could still take back.
        if needs_replication {
            store::outbox::await_replication(&self.pool).await?;
        }
        // Every new message must be acknowledged above this (see crate::watch).
        let floor = self.acks.floor();
        // 0 before the first connection: then only the client's own check applies.
        let max_payload = self.js.client().server_info().max_payload;
        let mut parked: Vec<(usize, Poison)> = Vec::new();
        let mut failure: Option<anyhow::Error> = None;
        let mut pending = Vec::with_capacity(rows.len());
        // Each row's producer span, recorded when the batch is done.
        let mut hops: Vec<Option<Hop>> = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let hop = row
                .headers
                .get("traceparent")
                .and_then(|v| v.as_str())
                .and_then(TraceParent::parse)
                .map(|parent| {
                    let state = platform::trace::tracestate(
                        row.headers.get("tracestate").and_then(|v| v.as_str()),
                    );
                    let mut hop = Hop::start(
                        Kind::Producer,
                        format!("publish {}", row.subject),
                        Some(parent),
                    )
                    .with_tracestate(state);
                    hop.attribute("messaging.system", "nats");
                    hop.attribute("messaging.destination.name", row.subject.clone());
                    hop.attribute("messaging.message.id", row.id.to_string());
                    hop
                });
            let traceparent = hop
                .as_ref()
                .map(|h| (h.traceparent(), h.tracestate().map(str::to_owned)));
            hops.push(hop);
            let message = match message(row, traceparent, max_payload) {
                Ok(m) => m,
                Err(p) => {
                    parked.push((i, p));
                    continue;
                }
            };
            match self.js.send_publish(row.subject.clone(), message).await {
                Ok(ack) => pending.push((i, std::future::IntoFuture::into_future(ack))),
                Err(e) => match poison::classify(&e) {
                    Some(p) => parked.push((i, p)),
                    None => {
                        // The connection is likely gone: leave the rest of the batch for the retry.
                        failure = Some(
                            anyhow::Error::new(e).context(format!("publishing event {}", row.id)),
                        );
                        break;
                    }
                },
            }
        }
        // The acks are awaited together (their timeouts run at once), so a
        // dead connection costs one timeout, not one per row.
        let (waiting, acks): (Vec<usize>, Vec<_>) = pending.into_iter().unzip();
        let acked = futures::future::join_all(acks).await;
        let mut published: Vec<i64> = Vec::with_capacity(acked.len());
        let mut sequences: Vec<u64> = Vec::with_capacity(acked.len());
        for (i, ack) in waiting.into_iter().zip(acked) {
            let row = &rows[i];
            match ack {
                Ok(ack) => {
                    if ack.duplicate {
                        metrics::counter!("soldonce_outbox_duplicates_total").increment(1);
                    } else {
                        sequences.push(ack.sequence);
                    }
                    lag.record(seconds_between(row.created_at, chrono::Utc::now()));
                    tracing::debug!(
                        event_id = %row.id,
                        order_id = %row.stream_id,
                        trace_id = row
                            .headers
                            .get("traceparent")
                            .and_then(|v| v.as_str())
                            .and_then(platform::trace::TraceParent::parse)
                            .map(|t| t.trace_id()),
                        subject = %row.subject,
                        "event published"
                    );
                    published.push(row.position);
                }
                Err(e) => match poison::classify(&e) {
                    Some(p) => parked.push((i, p)),
                    None => {
                        if let Some(hop) = hops[i].as_mut() {
                            hop.fail(&e);
                        }
                        failure.get_or_insert_with(|| {
                            anyhow::Error::new(e)
                                .context(format!("awaiting the ack of event {}", row.id))
                        });
                    }
                },
            }
        }
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
            let last = rows.iter().map(|r| r.position).max().unwrap_or_default();
            more |= store::outbox::delete(&mut tx, &published, last)
                .await?
                .newer;
        }
        let to_park: Vec<(i64, &str)> = parked
            .iter()
            .map(|(i, p)| (rows[*i].position, p.reason))
            .collect();
        store::outbox::park(&mut tx, &to_park).await?;
        tx.commit().await?;
        self.left_since_vacuum
            .fetch_add((published.len() + parked.len()) as u64, Ordering::Relaxed);
        metrics::counter!("soldonce_outbox_published_total").increment(published.len() as u64);
        for (i, p) in &parked {
            let row = &rows[*i];
            metrics::counter!("soldonce_outbox_parked_total", "reason" => p.reason).increment(1);
            tracing::error!(
                event_id = %row.id,
                subject = %row.subject,
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

/// Seconds from `from` to `to`, never negative (the two clocks are the
/// database's and this process's: on one machine, one clock).
fn seconds_between(from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>) -> f64 {
    ((to - from).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}

/// The message for `row`, or why it can never be published: a subject the
/// stream does not take, or a size over the server's `max_payload` (counted
/// as the server does: headers plus payload). The payload is the bytes its
/// writer stored, sent as they are.
fn message(
    row: &store::outbox::OutboxRow,
    traceparent: Option<(TraceParent, Option<String>)>,
    max_payload: usize,
) -> Result<PublishMessage, Poison> {
    if !poison::publishable_subject(&row.subject) {
        return Err(Poison::new(
            poison::BAD_SUBJECT,
            format!("{:?} is not a subject under {}", row.subject, bus::SUBJECTS),
        ));
    }
    let id = row.id.to_string();
    let position = row.position.to_string();
    let mut headers: Vec<(&str, &str)> = vec![
        ("Nats-Msg-Id", id.as_str()),
        (bus::POSITION_HEADER, position.as_str()),
    ];
    // The relay's own span (a parsed traceparent: printable ASCII, never the stored text).
    let (traceparent, tracestate) = match traceparent {
        Some((t, s)) => (Some(t.to_string()), s),
        None => (None, None),
    };
    if let Some(state) = &tracestate {
        headers.push(("tracestate", state.as_str()));
    }
    match (&traceparent, row.headers.get("traceparent")) {
        (Some(tp), _) => headers.push(("traceparent", tp.as_str())),
        (None, Some(_)) => {
            tracing::warn!(event_id = %row.id, "dropping a malformed traceparent header")
        }
        (None, None) => {}
    }
    let size = poison::wire_size(&headers, row.payload.len());
    if max_payload > 0 && size > max_payload {
        return Err(Poison::new(
            poison::TOO_LARGE,
            format!("the message is {size} bytes (headers and payload); the server's max_payload is {max_payload}"),
        ));
    }
    // `message_id` adds a header; `headers()` would replace them all.
    let mut publish = PublishMessage::build()
        .payload(row.payload.clone().into())
        .message_id(&id);
    for (name, value) in &headers[1..] {
        publish = publish.header(*name, *value);
    }
    Ok(publish)
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

/// Vacuums the outbox each time `after` rows have left it (checked every
/// [`VACUUM_LOOK_EVERY`]), while this role may; see [`store::outbox::vacuum`].
async fn vacuum_outbox(
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

async fn report_backlog(pool: PgPool, mut stop: watch::Receiver<bool>) {
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
