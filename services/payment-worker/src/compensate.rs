//! Carrying out compensations: every refund soldonce decided is asked of the
//! PSP with the stable key `refund:<payment_id>` until the PSP confirms it
//! (an uncaptured authorization is voided instead, `void:<payment_id>`),
//! across restarts (the work lives in the database, claimed by lease, so N
//! workers share it and a crashed worker's claims come back).

use crate::psp::{Psp, PspError, Void};
use futures::StreamExt;
use sqlx::PgPool;
use std::time::Duration;
use store::compensations::{self, Compensation};

/// How long a claim keeps other workers away from a compensation.
const LEASE: Duration = Duration::from_secs(30);
/// Compensations claimed per round.
const BATCH: i64 = 64;
/// Refunds asked of the PSP at once.
pub const IN_FLIGHT: usize = 16;

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub refunded: usize,
    pub postponed: usize,
    pub refused: usize,
}

/// Claims the compensations that are due and carries each out once.
pub async fn run_due(pool: &PgPool, psp: &Psp) -> Result<Round, store::StoreError> {
    let due = compensations::claim_due(pool, BATCH, LEASE).await?;
    let outcomes: Vec<Outcome> = futures::stream::iter(due)
        .map(|c| carry_out(pool, psp, c))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut round = Round::default();
    for outcome in outcomes {
        match outcome {
            Outcome::Refunded => round.refunded += 1,
            Outcome::Postponed => round.postponed += 1,
            Outcome::Refused => round.refused += 1,
        }
    }
    if let Ok((n, oldest)) = compensations::outstanding(pool).await {
        metrics::gauge!("soldonce_compensations_outstanding").set(n as f64);
        let age = oldest.map_or(0.0, |t| {
            (chrono::Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
        });
        metrics::gauge!("soldonce_compensations_oldest_seconds").set(age);
    }
    Ok(round)
}

enum Outcome {
    Refunded,
    Postponed,
    Refused,
}

#[tracing::instrument(skip_all, fields(payment_id = %c.payment_id, order_id = ?c.order_id, attempt = c.attempts, method = %c.refund_method))]
async fn carry_out(pool: &PgPool, psp: &Psp, c: Compensation) -> Outcome {
    let outcome = if c.is_void() {
        void(pool, psp, &c).await
    } else {
        refund(pool, psp, &c).await
    };
    let label = match outcome {
        Outcome::Refunded => "refunded",
        Outcome::Postponed => "postponed",
        Outcome::Refused => "refused",
    };
    let kind = if c.is_void() { "void" } else { "refund" };
    metrics::counter!("soldonce_compensations_total", "kind" => kind, "outcome" => label)
        .increment(1);
    outcome
}

/// Voids an uncaptured authorization: nothing was taken, nothing is given back.
async fn void(pool: &PgPool, psp: &Psp, c: &Compensation) -> Outcome {
    match psp.void(&c.payment_id, &c.refund_key()).await {
        Void::Voided(payment) => {
            match compensations::complete(pool, &c.payment_id, &payment.id, None, "payment-worker")
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        reason = c.reason.as_deref().unwrap_or(""),
                        cancellation = payment.cancellation_reason.as_deref().unwrap_or(""),
                        "authorization voided"
                    );
                    Outcome::Refunded
                }
                Err(e) => postpone(pool, c, &format!("recording the void: {e}")).await,
            }
        }
        Void::Retry(why) => postpone(pool, c, &why).await,
        Void::NeedsPerson(why) => refuse(pool, c, &why).await,
    }
}

/// Refunds a payment whose money was taken.
async fn refund(pool: &PgPool, psp: &Psp, c: &Compensation) -> Outcome {
    match psp.refund_once(&c.payment_id, &c.refund_key()).await {
        Ok(refund) if refund.status == "succeeded" => {
            match compensations::complete(pool, &c.payment_id, &refund.id, None, "payment-worker")
                .await
            {
                Ok(_) => {
                    tracing::info!(refund_id = %refund.id, reason = c.reason.as_deref().unwrap_or(""), "payment refunded");
                    Outcome::Refunded
                }
                // The PSP refunded it; recording failed. The lease runs out and the same key replays the refund.
                Err(e) => postpone(pool, c, &format!("recording the refund: {e}")).await,
            }
        }
        Ok(refund) => {
            postpone(
                pool,
                c,
                &format!("refund {} is {}", refund.id, refund.status),
            )
            .await
        }
        Err(PspError::Retryable(why)) => postpone(pool, c, &why).await,
        Err(PspError::NothingLeft(why)) => refunded_elsewhere(pool, psp, c, &why).await,
        Err(PspError::Refused(why) | PspError::WrongState(why)) => {
            refuse(pool, c, &format!("refused by the PSP: {why}")).await
        }
    }
}

/// The PSP has nothing left to refund: the payment was refunded without
/// this key (at its dashboard, by another system). A refund there of this
/// compensation's whole amount completes it; anything else needs a person.
async fn refunded_elsewhere(pool: &PgPool, psp: &Psp, c: &Compensation, why: &str) -> Outcome {
    let payment = match psp.payment(&c.payment_id).await {
        Ok(Some(payment)) => payment,
        Ok(None) => {
            return refuse(
                pool,
                c,
                &format!("{why}; the PSP no longer holds the payment"),
            )
            .await
        }
        Err(e) => return postpone(pool, c, &format!("{why}; looking it up: {e}")).await,
    };
    let whole = payment
        .refunds
        .iter()
        .find(|r| r.status == "succeeded" && r.amount_minor == c.amount_minor);
    match whole {
        Some(refund) => {
            match compensations::complete(
                pool,
                &c.payment_id,
                &refund.id,
                Some(c.amount_minor),
                "payment-worker",
            )
            .await
            {
                Ok(_) => {
                    tracing::info!(refund_id = %refund.id, "payment was refunded at the PSP without soldonce's key: recorded");
                    Outcome::Refunded
                }
                Err(e) => postpone(pool, c, &format!("recording the refund: {e}")).await,
            }
        }
        None => {
            let refunded = payment.refunded_minor();
            let detail = format!(
                "{why}; the PSP shows {refunded} of {} refunded, in no single refund of that amount",
                c.amount_minor
            );
            refuse(pool, c, &detail).await
        }
    }
}

/// The PSP's answer is final and not a refund: it stays outstanding for a person.
async fn refuse(pool: &PgPool, c: &Compensation, why: &str) -> Outcome {
    tracing::error!(%why, "the PSP refused the refund: it needs a person");
    if let Err(e) = compensations::refuse(pool, &c.payment_id, why).await {
        tracing::warn!(error = %e, "could not record the refusal; retrying later");
    }
    Outcome::Refused
}

async fn postpone(pool: &PgPool, c: &Compensation, why: &str) -> Outcome {
    let delay = backoff(c.attempts);
    tracing::warn!(%why, retry_in = ?delay, "refund not confirmed yet");
    if let Err(e) = compensations::postpone(pool, &c.payment_id, delay, why).await {
        tracing::warn!(error = %e, "could not postpone; the lease brings it back");
    }
    Outcome::Postponed
}

/// 250 ms doubling per attempt up to a minute, with up to 25 % jitter.
pub(crate) fn backoff(attempts: i32) -> Duration {
    let exp = u32::try_from(attempts.clamp(1, 16) - 1).unwrap_or(0);
    let base = Duration::from_millis(250)
        .saturating_mul(2u32.saturating_pow(exp))
        .min(Duration::from_secs(60));
    base + base.mul_f64(rand::random::<f64>() * 0.25)
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn retries_back_off_from_a_quarter_second_to_a_minute() {
        assert!(
            backoff(1) >= Duration::from_millis(250) && backoff(1) < Duration::from_millis(320)
        );
        assert!(backoff(3) >= Duration::from_secs(1));
        assert!(backoff(100) <= Duration::from_secs(75));
    }
}
