//! Carrying out captures: every capture soldonce decided (an authorized
//! order shipped) is asked of the PSP with the stable key
//! `capture:<payment_id>` until the PSP confirms it, across restarts (the
//! work lives in the database, claimed by lease, so N workers share it and
//! a crashed worker's claims come back). An authorization that can no
//! longer be captured (it lapsed, or was voided elsewhere) is refused for a
//! person: the goods left unpaid.

use crate::psp::{Psp, PspError, PspPayment};
use futures::StreamExt;
use sqlx::PgPool;
use std::time::Duration;
use store::captures::{self, Capture};

/// How long a claim keeps other workers away from a capture.
const LEASE: Duration = Duration::from_secs(30);
/// Captures claimed per round.
const BATCH: i64 = 64;
/// Captures asked of the PSP at once.
pub const IN_FLIGHT: usize = 16;

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub captured: usize,
    pub postponed: usize,
    pub refused: usize,
}

impl Round {
    /// Whether the round found any work.
    pub fn busy(&self) -> bool {
        self.captured + self.postponed + self.refused > 0
    }
}

/// What the PSP's answer came to; a capture it confirmed is recorded with
/// the round's others, in one transaction.
#[derive(Debug)]
enum Outcome {
    Captured(Capture, i64),
    Postponed,
    Refused,
}

/// Claims the captures that are due, asks the PSP for each once, and
/// records those it confirmed together.
pub async fn run_due(pool: &PgPool, psp: &Psp) -> Result<Round, store::StoreError> {
    let due = captures::claim_due(pool, BATCH, LEASE).await?;
    let outcomes: Vec<Outcome> = futures::stream::iter(due)
        .map(|c| carry_out(pool, psp, c))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut round = Round::default();
    let mut confirmed = Vec::new();
    for outcome in outcomes {
        match outcome {
            Outcome::Captured(c, taken) => confirmed.push((c, taken)),
            Outcome::Postponed => round.postponed += 1,
            Outcome::Refused => round.refused += 1,
        }
    }
    let (captured, postponed) = record(pool, confirmed).await;
    round.captured += captured;
    round.postponed += postponed;
    observe_outstanding(pool).await;
    Ok(round)
}

/// Records the confirmed captures in one transaction; if that fails, each
/// is postponed (the same key replays, and the PSP answers with the capture
/// it made). Returns how many were recorded and how many postponed.
async fn record(pool: &PgPool, confirmed: Vec<(Capture, i64)>) -> (usize, usize) {
    if confirmed.is_empty() {
        return (0, 0);
    }
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
                    tracing::info!(payment_id = %c.payment_id, order_id = %c.order_id, amount_minor = taken, "payment captured");
                }
            }
            metrics::counter!("soldonce_captures_total", "outcome" => "captured")
                .increment(confirmed.len() as u64);
            (confirmed.len(), 0)
        }
        Err(e) => {
            let why = format!("recording the capture: {e}");
            for (c, _) in &confirmed {
                postpone(pool, c, &why).await;
            }
            metrics::counter!("soldonce_captures_total", "outcome" => "postponed")
                .increment(confirmed.len() as u64);
            (0, confirmed.len())
        }
    }
}

/// The captures-outstanding gauges, read after each round.
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

#[tracing::instrument(skip_all, fields(payment_id = %c.payment_id, order_id = %c.order_id, attempt = c.attempts))]
async fn carry_out(pool: &PgPool, psp: &Psp, c: Capture) -> Outcome {
    let outcome = match psp.capture_once(&c.payment_id, &c.key(), None).await {
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
