//! What a payment's change does besides the books: counting it, announcing its new status,
//! and arming the timer of an authorization that can lapse. Also the timer's jobs (settling a
//! `processing` payment, expiring an authorization), which change the books by themselves.

use std::sync::PoisonError;
use std::time::Duration;

use chrono::Utc;

use super::AppState;
use crate::counters::Fault;
use crate::model::{FailureReason, Payment, PaymentStatus};
use crate::settlement::{Job, Settled};
use crate::webhook::Trace;

/// Counts and announces a payment's new status (nothing for `processing`), and arms the
/// expiry of a fresh authorization when `authorization_ttl_ms` is set.
pub(super) fn payment_changed(state: &AppState, payment: &Payment) {
    state.counters.payment_outcome(payment.status);
    if payment.failure_reason == Some(FailureReason::CardDeclined) {
        state.counters.fault_injected(Fault::Decline, 1);
    }
    if let Some(reason) = payment.cancellation_reason {
        state.counters.payment_canceled(reason);
    }
    if payment.status == PaymentStatus::RequiresCapture {
        let ttl_ms = state.faults.current().authorization_ttl_ms;
        if ttl_ms > 0 {
            let job = Job::Expire(payment.id.clone());
            state
                .settlements
                .schedule(job, Duration::from_millis(ttl_ms));
        }
    }
    let trace = state
        .traces
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&payment.id);
    state.webhooks.payment_changed(payment, trace);
}

/// Remembers the trace the request that changed a payment came with
/// (`hop`): the webhooks of the change carry it.
pub(super) fn remember_trace(state: &AppState, payment_id: &str, hop: &platform::otel::Hop) {
    let trace: Trace = (hop.traceparent(), hop.tracestate().map(str::to_owned));
    state
        .traces
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(payment_id.to_owned(), trace);
}

/// Does one timer job: journaled and applied, then counted and announced.
pub(crate) fn run_job(state: &AppState, job: &Job) -> Settled {
    let (changed, payment_id) = match job {
        Job::Settle(id) => (state.ledger().settle(id, Utc::now()), id),
        Job::Expire(id) => (state.ledger().expire(id, Utc::now()), id),
    };
    match changed {
        Ok(Some(payment)) => {
            tracing::info!(payment_id, order_id = %payment.reference, status = %payment.status, ?job, "payment changed by its timer");
            payment_changed(state, &payment);
            Settled::Done
        }
        Ok(None) => Settled::Done,
        Err(error) => {
            tracing::error!(%error, payment_id, ?job, "the books could not record a timer's change; will try again");
            Settled::Retry
        }
    }
}
