//! Carrying out the refunds operators ask for (`soldonce order refund`,
//! checkout's admin API): each is asked of the PSP with the stable key
//! `refund:<payment_id>:<key>` until the PSP confirms it, across restarts
//! (claimed by lease, like compensations and captures). An operator's
//! cancel of an order whose payment is an uncaptured authorization asks
//! for a void instead, with the key `void:<payment_id>`.

use crate::psp::{Psp, PspError, Void};
use futures::StreamExt;
use sqlx::PgPool;
use std::time::Duration;
use store::operator_refunds::{self, OperatorRefund};

/// How long a claim keeps other workers away from a refund.
const LEASE: Duration = Duration::from_secs(30);
/// Refunds claimed per round.
const BATCH: i64 = 32;
/// Refunds asked of the PSP at once.
pub const IN_FLIGHT: usize = 4;

/// Claims the operator refunds that are due and carries each out once;
/// returns how many it handled.
pub async fn run_due(pool: &PgPool, psp: &Psp) -> Result<usize, store::StoreError> {
    let due = operator_refunds::claim_due(pool, BATCH, LEASE).await?;
    let n = due.len();
    futures::stream::iter(due)
        .for_each_concurrent(IN_FLIGHT, |r| carry_out(pool, psp, r))
        .await;
    if let Ok((n, oldest)) = operator_refunds::outstanding(pool).await {
        metrics::gauge!("soldonce_operator_refunds_outstanding").set(n as f64);
        let age = oldest.map_or(0.0, |t| {
            (chrono::Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
        });
        metrics::gauge!("soldonce_operator_refunds_oldest_seconds").set(age);
    }
    Ok(n)
}

/// What became of one attempt, and why it was set aside (`true`: to retry).
type Attempt = (&'static str, Option<(bool, String)>);

#[tracing::instrument(skip_all, fields(order_id = %r.order_id, key = %r.key, attempt = r.attempts, void = r.void))]
async fn carry_out(pool: &PgPool, psp: &Psp, r: OperatorRefund) {
    let (outcome, aside) = if r.void {
        void(pool, psp, &r).await
    } else {
        refund(pool, psp, &r).await
    };
    if let Some((retry, why)) = aside {
        let delay = retry.then(|| crate::compensate::backoff(r.attempts));
        if retry {
            tracing::warn!(%why, retry_in = ?delay, "operator refund not confirmed yet");
        } else {
            tracing::error!(%why, "operator refund refused by the PSP: it needs a person");
        }
        if let Err(e) = operator_refunds::set_aside(pool, &r, delay, &why).await {
            tracing::warn!(error = %e, "could not set the refund aside; the lease brings it back");
        }
    }
    metrics::counter!("soldonce_operator_refunds_total", "outcome" => outcome).increment(1);
}

/// Voids the uncaptured authorization of a cancelled order: nothing was
/// taken, nothing is given back. One that lapsed or was voided already is
/// as good; one captured meanwhile needs a person.
async fn void(pool: &PgPool, psp: &Psp, r: &OperatorRefund) -> Attempt {
    match psp.void(&r.payment_id, &r.psp_key()).await {
        Void::Voided(payment) => {
            match operator_refunds::complete(pool, r, &payment.id, "payment-worker").await {
                Ok(_) => {
                    tracing::info!(
                        cancellation = payment.cancellation_reason.as_deref().unwrap_or(""),
                        "cancelled order's authorization voided"
                    );
                    ("voided", None)
                }
                Err(e) => (
                    "postponed",
                    Some((true, format!("recording the void: {e}"))),
                ),
            }
        }
        Void::Retry(why) => ("postponed", Some((true, why))),
        Void::NeedsPerson(why) => ("refused", Some((false, why))),
    }
}

/// Refunds part or all of what the payment took.
async fn refund(pool: &PgPool, psp: &Psp, r: &OperatorRefund) -> Attempt {
    let asked = psp
        .refund_part_once(&r.payment_id, &r.psp_key(), Some(r.amount_minor))
        .await;
    match asked {
        Ok(refund) if refund.status == "succeeded" => {
            match operator_refunds::complete(pool, r, &refund.id, "payment-worker").await {
                Ok(_) => {
                    tracing::info!(refund_id = %refund.id, amount_minor = r.amount_minor, "operator refund made");
                    ("refunded", None)
                }
                Err(e) => (
                    "postponed",
                    Some((true, format!("recording the refund: {e}"))),
                ),
            }
        }
        Ok(refund) => (
            "postponed",
            Some((true, format!("refund {} is {}", refund.id, refund.status))),
        ),
        Err(PspError::Retryable(why)) => ("postponed", Some((true, why))),
        Err(e) => (
            "refused",
            Some((false, format!("the PSP refused the refund: {e}"))),
        ),
    }
}
