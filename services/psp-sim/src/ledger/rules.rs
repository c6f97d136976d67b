//! Which change each status allows, and how much: one place for the checks that live requests
//! and journal replay both make, and for the transitions both apply.

use chrono::{DateTime, Utc};

use super::{Ledger, LedgerError, Outcome};
use crate::model::{
    ActionOutcome, CancellationReason, CaptureMethod, FailureReason, Payment, PaymentStatus,
};

/// The amount a refund may take (`requested`, or everything left), or why it may not.
pub(super) fn may_refund(payment: &Payment, requested: Option<i64>) -> Result<i64, LedgerError> {
    let status = payment.status;
    let payment_id = payment.id.clone();
    match status {
        PaymentStatus::Succeeded => {}
        PaymentStatus::Processing => return Err(LedgerError::PaymentProcessing(payment_id)),
        PaymentStatus::RequiresAction | PaymentStatus::RequiresCapture => {
            return Err(LedgerError::NotCaptured { payment_id, status })
        }
        PaymentStatus::Failed | PaymentStatus::Canceled => {
            return Err(LedgerError::NotRefundable { payment_id, status })
        }
    }
    let remaining = payment.refundable();
    let requested = requested.unwrap_or(remaining);
    if requested > remaining || requested < 1 {
        return Err(LedgerError::ExceedsRemaining {
            requested,
            remaining,
        });
    }
    Ok(requested)
}

/// The amount a capture takes (`requested`, or all that was authorized), or why it may not.
pub(super) fn may_capture(payment: &Payment, requested: Option<i64>) -> Result<i64, LedgerError> {
    let status = payment.status;
    match status {
        PaymentStatus::RequiresCapture => {}
        PaymentStatus::Processing => {
            return Err(LedgerError::PaymentProcessing(payment.id.clone()))
        }
        _ => {
            return Err(LedgerError::NotCapturable {
                payment_id: payment.id.clone(),
                status,
            })
        }
    }
    let authorized = payment.amount_minor;
    let requested = requested.unwrap_or(authorized);
    if requested > authorized || requested < 1 {
        return Err(LedgerError::CaptureExceedsAuthorized {
            requested,
            authorized,
        });
    }
    Ok(requested)
}

/// Whether the merchant may cancel the payment now.
pub(super) fn may_cancel(payment: &Payment) -> Result<(), LedgerError> {
    match payment.status {
        PaymentStatus::RequiresAction | PaymentStatus::RequiresCapture => Ok(()),
        PaymentStatus::Processing => Err(LedgerError::PaymentProcessing(payment.id.clone())),
        status => Err(LedgerError::NotCancelable {
            payment_id: payment.id.clone(),
            status,
        }),
    }
}

/// Whether the buyer may act on the payment now.
pub(super) fn may_act(payment: &Payment) -> Result<(), LedgerError> {
    match payment.status {
        PaymentStatus::RequiresAction => Ok(()),
        status => Err(LedgerError::NotAwaitingAction {
            payment_id: payment.id.clone(),
            status,
        }),
    }
}

/// The amount a dispute takes back (`requested`, or everything left), or why it may not.
pub(super) fn may_dispute(payment: &Payment, requested: Option<i64>) -> Result<i64, LedgerError> {
    let remaining = payment.refundable();
    if payment.status != PaymentStatus::Succeeded || remaining < 1 {
        return Err(LedgerError::NotDisputable {
            payment_id: payment.id.clone(),
            status: payment.status,
            remaining,
        });
    }
    let requested = requested.unwrap_or(remaining);
    if requested > remaining || requested < 1 {
        return Err(LedgerError::DisputeExceedsRemaining {
            requested,
            remaining,
        });
    }
    Ok(requested)
}

impl Outcome {
    /// The status this outcome ends in, for a payment captured this way.
    pub fn status(self, method: CaptureMethod) -> PaymentStatus {
        match (self, method) {
            (Outcome::Succeeded, CaptureMethod::Automatic) => PaymentStatus::Succeeded,
            (Outcome::Succeeded, CaptureMethod::Manual) => PaymentStatus::RequiresCapture,
            (Outcome::Failed, _) => PaymentStatus::Failed,
        }
    }

    /// The failure reason this outcome ends with.
    pub fn failure_reason(self) -> Option<FailureReason> {
        match self {
            Outcome::Succeeded => None,
            Outcome::Failed => Some(FailureReason::CardDeclined),
        }
    }
}

impl Ledger {
    /// Ends a payment's undecided state as `outcome` says, at `at`: authorized (then captured
    /// at once, or held until captured) or failed for `failure`.
    pub(super) fn decide(
        &mut self,
        payment_id: &str,
        outcome: Outcome,
        failure: FailureReason,
        at: DateTime<Utc>,
    ) {
        let Some(payment) = self.payments.get_mut(payment_id) else {
            return;
        };
        payment.status = outcome.status(payment.capture_method);
        payment.failure_reason = outcome.failure_reason().map(|_| failure);
        match payment.status {
            PaymentStatus::Succeeded => payment.amount_captured = payment.amount_minor,
            PaymentStatus::RequiresCapture => {
                self.authorized.insert(payment_id.to_owned(), at);
            }
            _ => {}
        }
    }

    /// Applies the buyer's action to a `requires_action` payment.
    pub(super) fn act_on(&mut self, payment_id: &str, outcome: ActionOutcome, at: DateTime<Utc>) {
        match outcome {
            ActionOutcome::Succeeded => {
                self.decide(
                    payment_id,
                    Outcome::Succeeded,
                    FailureReason::CardDeclined,
                    at,
                );
            }
            ActionOutcome::Failed => {
                let failure = FailureReason::AuthenticationFailed;
                self.decide(payment_id, Outcome::Failed, failure, at);
            }
            ActionOutcome::Abandoned => {
                self.cancel_now(payment_id, CancellationReason::Abandoned);
            }
        }
    }

    /// Cancels a payment that holds no captured money.
    pub(super) fn cancel_now(&mut self, payment_id: &str, reason: CancellationReason) {
        self.authorized.remove(payment_id);
        if let Some(payment) = self.payments.get_mut(payment_id) {
            payment.status = PaymentStatus::Canceled;
            payment.cancellation_reason = Some(reason);
        }
    }
}
