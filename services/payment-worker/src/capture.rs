//! Carrying out captures: every capture soldonce decided (an authorized
//! order shipped) is asked of the PSP with the stable key
//! `capture:<payment_id>` until the PSP confirms it, across restarts (the
//! work lives in the database, claimed by lease, so N workers share it and
//! a crashed worker's claims come back). An authorization that can no
//! longer be captured (it lapsed, or was voided elsewhere) is refused for a
//! person: the goods left unpaid.

use crate::psp::{Psp, PspError, PspPayment};
use sqlx::PgPool;
use std::time::Duration;
use store::captures::{self, Capture};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long a claim keeps other workers away from a capture.
const LEASE: Duration = Duration::from_secs(30);
/// Captures asked of the PSP at once unless `CAPTURE_CONCURRENCY` says
/// otherwise. Each waits for the PSP's answer (a network round trip and the
/// PSP's own time), so this, divided by that time, caps the captures per
/// second: 64 at 50 ms is 1,280 a second, at 200 ms 320. It also spreads a burst of
/// captures (fulfillment decides them a warehouse step at a time) over
/// time, so the PSP's calls and webhooks do not all land at once on the
/// cores that confirm orders.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// While captures keep coming, how often more are claimed (at most).
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How long after a claim last found captures the worker keeps looking
/// every [`LOOK_EVERY`]: fulfillment decides captures in bursts, one per
/// warehouse step, so a claim between two bursts finds none, and waiting
/// the idle interval then would hold the next burst back that long.
const BUSY_FOR: Duration = Duration::from_secs(2);
/// How long a confirmed capture may wait for others to be recorded with
/// (unless nothing else is in flight, or [`RECORD_BATCH`] wait).
const RECORD_LINGER: Duration = Duration::from_millis(50);
/// The most confirmed captures recorded in one transaction.
const RECORD_BATCH: usize = 64;
/// How often the outstanding-capture gauges are read (at most: on a claim).
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// What the PSP's answer came to; a capture it confirmed is recorded with
/// others, in one transaction.
#[derive(Debug)]
enum Outcome {
    Captured(Capture, i64),
    Postponed,
    Refused,
}

/// Carries out captures until `stop` turns true, as a pipeline: up to
/// `in_flight` asked of the PSP at once, more claimed as answers come back
/// (every `LOOK_EVERY` while any were found in the last `BUSY_FOR`,
/// else every `interval`), and those the PSP confirmed recorded together
/// once `RECORD_LINGER` has passed, one transaction at a time, while the
/// claims and calls go on. No capture waits for a slower one, nor for a
/// recording: an earlier version asked in rounds of 64, each round waiting
/// for its last answer, which held captures to about 250 a second with a
/// 20 ms PSP on 2 cores (an open loop of 300 orders a second fell further
/// behind every second). On stop, the captures in flight are finished and
/// recorded.
pub async fn run(
    pool: PgPool,
    psp: Psp,
    in_flight: usize,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut line = Pipeline::new(in_flight.max(1));
    loop {
        let stopping = *stop.borrow();
        if !stopping && line.has_room() && Instant::now() >= line.next_claim {
            line.claim(&pool, &psp, interval).await;
        }
        line.record_if_due(&pool);
        if stopping && line.is_empty() {
            return;
        }
        let record_at = line.waiting_since + RECORD_LINGER;
        let may_record = !line.confirmed.is_empty() && line.recording.is_empty();
        let may_claim = !stopping && line.has_room();
        tokio::select! {
            Some(done) = line.flight.join_next(), if !line.flight.is_empty() => line.answered(done),
            Some(done) = line.recording.join_next(), if !line.recording.is_empty() => {
                if let Err(e) = done {
                    // Its captures stay pending; their leases bring them back.
                    tracing::error!(error = %e, "a capture recording task ended abnormally");
                }
            }
            () = tokio::time::sleep_until(record_at), if may_record => {}
            () = tokio::time::sleep_until(line.next_claim), if may_claim => {}
            _ = stop.wait_for(|s| *s), if !stopping => {}
        }
    }
}

/// The captures in hand: asked of the PSP, confirmed and waiting to be
/// recorded, and being recorded.
struct Pipeline {
    in_flight: usize,
    flight: JoinSet<Outcome>,
    /// The one recording transaction under way, if any: claims and answers
    /// go on meanwhile, and what it does not take waits for the next.
    recording: JoinSet<()>,
    confirmed: Vec<(Capture, i64)>,
    /// When the first of `confirmed` came back.
    waiting_since: Instant,
    next_claim: Instant,
    gauges_at: Option<Instant>,
    /// When a claim last found captures.
    found_at: Option<Instant>,
}

impl Pipeline {
    fn new(in_flight: usize) -> Self {
        Pipeline {
            in_flight,
            flight: JoinSet::new(),
            recording: JoinSet::new(),
            confirmed: Vec::new(),
            waiting_since: Instant::now(),
            next_claim: Instant::now(),
            gauges_at: None,
            found_at: None,
        }
    }

    fn has_room(&self) -> bool {
        self.flight.len() < self.in_flight
    }

    fn is_empty(&self) -> bool {
        self.flight.is_empty() && self.confirmed.is_empty() && self.recording.is_empty()
    }

    /// Claims what fits and asks the PSP for each; sets when to look next.
    async fn claim(&mut self, pool: &PgPool, psp: &Psp, interval: Duration) {
        let room = (self.in_flight - self.flight.len()) as i64;
        match captures::claim_due(pool, room, LEASE).await {
            Ok(due) => {
                if !due.is_empty() {
                    self.found_at = Some(Instant::now());
                }
                for c in due {
                    self.flight.spawn(carry_out(pool.clone(), psp.clone(), c));
                }
            }
            Err(e) => tracing::warn!(error = %e, "claiming captures failed; retrying"),
        }
        let busy = self.found_at.is_some_and(|at| at.elapsed() < BUSY_FOR);
        self.next_claim = Instant::now() + if busy { LOOK_EVERY } else { interval };
        if self.gauges_at.is_none_or(|at| at.elapsed() >= GAUGES_EVERY) {
            observe_outstanding(pool).await;
            self.gauges_at = Some(Instant::now());
        }
    }

    /// Starts recording what is confirmed, if nothing is being recorded and
    /// the batch is full, nothing else is in flight, or the linger passed.
    fn record_if_due(&mut self, pool: &PgPool) {
        let due = self.confirmed.len() >= RECORD_BATCH
            || self.flight.is_empty()
            || self.waiting_since.elapsed() >= RECORD_LINGER;
        if !self.confirmed.is_empty() && self.recording.is_empty() && due {
            // At most a batch; the rest waited as long, and goes next.
            let n = self.confirmed.len().min(RECORD_BATCH);
            let batch: Vec<(Capture, i64)> = self.confirmed.drain(..n).collect();
            self.recording.spawn(record(pool.clone(), batch));
        }
    }

    /// Takes this answer and every other one already in.
    fn answered(&mut self, first: Result<Outcome, tokio::task::JoinError>) {
        let mut done = Some(first);
        while let Some(d) = done.take().or_else(|| self.flight.try_join_next()) {
            match d {
                Ok(Outcome::Captured(c, taken)) => {
                    if self.confirmed.is_empty() {
                        self.waiting_since = Instant::now();
                    }
                    self.confirmed.push((c, taken));
                }
                Ok(Outcome::Postponed | Outcome::Refused) => {}
                // The capture's lease brings it back to be asked again.
                Err(e) => tracing::error!(error = %e, "a capture task ended abnormally"),
            }
        }
    }
}

/// Records the confirmed captures in one transaction; if that fails, each
/// is postponed (the same key replays, and the PSP answers with the capture
/// it made).
async fn record(pool: PgPool, confirmed: Vec<(Capture, i64)>) {
    let pool = &pool;
    let batch: Vec<captures::Captured> = confirmed
        .iter()
        .map(|(c, taken)| captures::Captured {
            payment_id: c.payment_id.clone(),
            captured_minor: *taken,
        })
        .collect();
    match captures::complete_many(pool, &batch, "payment-worker").await {
        Ok(recorded) => {
            for (c, taken) in &confirmed {
                if recorded.contains(&c.payment_id) {
                    metrics::counter!("soldonce_payments_captured_minor_total", "currency" => c.currency.clone())
                        .increment(u64::try_from(*taken).unwrap_or(0));
                    tracing::info!(payment_id = %c.payment_id, order_id = %c.order_id, trace_id = %trace_id(c), amount_minor = taken, "payment captured");
                }
            }
            metrics::counter!("soldonce_captures_total", "outcome" => "captured")
                .increment(confirmed.len() as u64);
        }
        Err(e) => {
            let why = format!("recording the capture: {e}");
            for (c, _) in &confirmed {
                postpone(pool, c, &why).await;
            }
            metrics::counter!("soldonce_captures_total", "outcome" => "postponed")
                .increment(confirmed.len() as u64);
        }
    }
}

/// The captures-outstanding gauges.
async fn observe_outstanding(pool: &PgPool) {
    if let Ok((n, oldest)) = captures::outstanding(pool).await {
        metrics::gauge!("soldonce_captures_outstanding").set(n as f64);
        let age = oldest.map_or(0.0, |t| {
            (chrono::Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
        });
        metrics::gauge!("soldonce_captures_oldest_seconds").set(age);
    }
    if let Ok(age) = captures::oldest_authorization_seconds(pool).await {
        metrics::gauge!("soldonce_authorizations_oldest_seconds").set(age);
    }
}

/// The W3C trace id of the capture's order (empty when it has none), for log lines.
fn trace_id(c: &Capture) -> String {
    c.traceparent
        .as_deref()
        .and_then(platform::trace::TraceParent::parse)
        .map(|t| t.trace_id())
        .unwrap_or_default()
}

#[tracing::instrument(skip_all, fields(payment_id = %c.payment_id, order_id = %c.order_id, trace_id = %trace_id(&c), attempt = c.attempts))]
async fn carry_out(pool: PgPool, psp: Psp, c: Capture) -> Outcome {
    let pool = &pool;
    let trace = c
        .traceparent
        .as_deref()
        .map(|t| (t, c.tracestate.as_deref()));
    let outcome = match psp.capture_once(&c.payment_id, &c.key(), None, trace).await {
        Ok(payment) => settle(pool, c, &payment).await,
        // Captured or canceled already: the payment says which.
        Err(PspError::WrongState(why)) => match psp.payment(&c.payment_id).await {
            Ok(Some(payment)) => settle(pool, c, &payment).await,
            Ok(None) => {
                refuse(
                    pool,
                    &c,
                    &format!("{why}; the PSP no longer holds the payment"),
                )
                .await
            }
            Err(e) => postpone(pool, &c, &format!("{why}; looking it up: {e}")).await,
        },
        Err(PspError::Retryable(why)) => postpone(pool, &c, &why).await,
        Err(e) => refuse(pool, &c, &format!("the PSP refused the capture: {e}")).await,
    };
    // A confirmed capture is counted once it is recorded (see `record`).
    let label = match outcome {
        Outcome::Captured(..) => None,
        Outcome::Postponed => Some("postponed"),
        Outcome::Refused => Some("refused"),
    };
    if let Some(label) = label {
        metrics::counter!("soldonce_captures_total", "outcome" => label).increment(1);
    }
    outcome
}

/// What the PSP's payment says of the capture.
async fn settle(pool: &PgPool, c: Capture, payment: &PspPayment) -> Outcome {
    match payment.status.as_str() {
        "succeeded" => {
            let taken = payment.amount_captured.unwrap_or(payment.amount_minor);
            Outcome::Captured(c, taken)
        }
        "canceled" => {
            let why = payment.cancellation_reason.as_deref().unwrap_or("unknown");
            let detail = format!(
                "the authorization was canceled ({why}) before its capture: the order shipped unpaid"
            );
            refuse(pool, &c, &detail).await
        }
        other => postpone(pool, &c, &format!("payment {} is {other}", payment.id)).await,
    }
}

/// The capture cannot happen: it stays outstanding for a person.
async fn refuse(pool: &PgPool, c: &Capture, why: &str) -> Outcome {
    tracing::error!(%why, "the payment cannot be captured: it needs a person");
    if let Err(e) = captures::refuse(pool, &c.payment_id, why).await {
        tracing::warn!(error = %e, "could not record the refusal; retrying later");
    }
    Outcome::Refused
}

async fn postpone(pool: &PgPool, c: &Capture, why: &str) -> Outcome {
    let delay = crate::compensate::backoff(c.attempts);
    tracing::warn!(%why, retry_in = ?delay, "capture not confirmed yet");
    if let Err(e) = captures::postpone(pool, &c.payment_id, delay, why).await {
        tracing::warn!(error = %e, "could not postpone; the lease brings it back");
    }
    Outcome::Postponed
}
