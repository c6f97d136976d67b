//! The changes the books are made of. Each [`Entry`] is first checked against the books, then
//! committed; live requests and journal replay take the same two steps, so a replayed journal
//! rebuilds exactly the books that wrote it. Entries added later (capture, cancel, action,
//! dispute) are checked and committed in `change.rs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{rules, Ledger, Position, RefundClaim};
use crate::model::{
    ActionOutcome, CancellationReason, CaptureRequest, Dispute, FailureReason, Payment,
    PaymentRequest, PaymentStatus, Refund, RefundRequest,
};

/// One change to the books, as journaled: one JSON object per line, tagged by `entry`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
pub enum Entry {
    /// A new payment: final, `processing`, `requires_action` or `requires_capture`.
    PaymentCreated {
        /// The payment as created (no refunds yet).
        payment: Payment,
        /// The request it was created with, to recognise replays of its key.
        request: PaymentRequest,
        /// How it ends: its status now, or once it settles.
        outcome: Outcome,
    },
    /// A `processing` payment settled as its creation's `outcome` said.
    PaymentSettled {
        /// The payment settled.
        payment_id: String,
        /// When it settled.
        settled_at: DateTime<Utc>,
    },
    /// A new refund.
    RefundCreated {
        /// The key it was created with.
        idempotency_key: String,
        /// The request it was created with, to recognise replays of its key.
        request: RefundRequest,
        /// The refund as created.
        refund: Refund,
    },
    /// A `requires_capture` payment captured: `succeeded`, the rest released.
    PaymentCaptured {
        /// The payment captured.
        payment_id: String,
        /// The key it was captured with.
        idempotency_key: String,
        /// The request it was captured with, to recognise replays of its key.
        request: CaptureRequest,
        /// The amount taken.
        amount_captured: i64,
        /// When.
        captured_at: DateTime<Utc>,
    },
    /// A payment canceled by the merchant (`requested`, with its key) or by its authorization
    /// lapsing (`expired`, without one).
    PaymentCanceled {
        /// The payment canceled.
        payment_id: String,
        /// The key the merchant canceled it with; none when it expired.
        idempotency_key: Option<String>,
        /// Why.
        reason: CancellationReason,
        /// When.
        canceled_at: DateTime<Utc>,
    },
    /// The buyer ended a `requires_action` payment's 3-D Secure step.
    ActionCompleted {
        /// The payment.
        payment_id: String,
        /// What the buyer did.
        outcome: ActionOutcome,
        /// When.
        completed_at: DateTime<Utc>,
    },
    /// A new dispute against captured money.
    DisputeCreated {
        /// The dispute as created.
        dispute: Dispute,
    },
}

/// How a payment ends, decided by the decline roll when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The money is authorized (and taken, with automatic capture).
    Succeeded,
    /// The card is declined.
    Failed,
}

impl Outcome {
    /// `Failed` if declined, else `Succeeded`.
    pub fn declined_if(declined: bool) -> Self {
        if declined {
            Outcome::Failed
        } else {
            Outcome::Succeeded
        }
    }
}

/// An entry that does not fit the books it is applied to (a damaged or edited journal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Inconsistent(pub(super) String);

pub(super) fn inconsistent(reason: String) -> Result<(), Inconsistent> {
    Err(Inconsistent(reason))
}

impl Ledger {
    /// Whether `entry` fits the books as they are; changes nothing.
    pub(super) fn check(&self, entry: &Entry) -> Result<(), Inconsistent> {
        match entry {
            Entry::PaymentCreated {
                payment, outcome, ..
            } => self.check_created(payment, *outcome),
            Entry::PaymentSettled { payment_id, .. } => {
                if !self.unsettled.contains_key(payment_id) {
                    return inconsistent(format!("payment {payment_id} is not processing"));
                }
                Ok(())
            }
            Entry::RefundCreated {
                idempotency_key,
                refund,
                ..
            } => {
                if self.refunds.contains_key(&refund.id) {
                    return inconsistent(format!("refund {} already exists", refund.id));
                }
                if self.refund_keys.contains_key(idempotency_key) {
                    return inconsistent(format!(
                        "idempotency key {idempotency_key:?} already has a refund"
                    ));
                }
                let payment = self.known(&refund.payment_id)?;
                rules::may_refund(payment, Some(refund.amount_minor))
                    .map(drop)
                    .map_err(|error| Inconsistent(format!("refund {}: {error}", refund.id)))
            }
            change => self.check_change(change),
        }
    }

    fn check_created(&self, payment: &Payment, outcome: Outcome) -> Result<(), Inconsistent> {
        if self.payments.contains_key(&payment.id) {
            return inconsistent(format!("payment {} already exists", payment.id));
        }
        if self.payment_keys.contains_key(&payment.idempotency_key) {
            return inconsistent(format!(
                "idempotency key {:?} already has a payment",
                payment.idempotency_key
            ));
        }
        let fits = match payment.status {
            PaymentStatus::Processing | PaymentStatus::RequiresAction => {
                payment.failure_reason.is_none()
            }
            status => {
                status == outcome.status(payment.capture_method)
                    && payment.failure_reason == outcome.failure_reason()
            }
        };
        let fresh = payment.refunds.is_empty()
            && payment.disputes.is_empty()
            && payment.cancellation_reason.is_none();
        if !fits || !fresh {
            return inconsistent(format!("payment {} does not match its outcome", payment.id));
        }
        Ok(())
    }

    /// The payment an entry names, which must exist.
    pub(super) fn known(&self, payment_id: &str) -> Result<&Payment, Inconsistent> {
        self.payments
            .get(payment_id)
            .ok_or_else(|| Inconsistent(format!("payment {payment_id} does not exist")))
    }

    /// Applies an entry that [`Ledger::check`] accepted.
    pub(super) fn commit(&mut self, entry: Entry) {
        match entry {
            Entry::PaymentCreated {
                payment,
                request,
                outcome,
            } => self.commit_created(payment, request, outcome),
            Entry::PaymentSettled {
                payment_id,
                settled_at,
            } => {
                if let Some(outcome) = self.unsettled.remove(&payment_id) {
                    let failure = FailureReason::CardDeclined;
                    self.decide(&payment_id, outcome, failure, settled_at);
                }
            }
            Entry::RefundCreated {
                idempotency_key,
                request,
                refund,
            } => self.commit_refund(idempotency_key, request, refund),
            change => self.commit_change(change),
        }
    }

    fn commit_created(&mut self, mut payment: Payment, request: PaymentRequest, outcome: Outcome) {
        let id = payment.id.clone();
        self.tick(payment.created_at);
        self.payment_order.insert(Position {
            created_at: payment.created_at,
            id: id.clone(),
        });
        self.payment_keys
            .insert(payment.idempotency_key.clone(), (request, id.clone()));
        self.references
            .entry(payment.reference.clone())
            .or_default()
            .push(id.clone());
        match payment.status {
            PaymentStatus::Processing => {
                self.unsettled.insert(id.clone(), outcome);
            }
            PaymentStatus::RequiresCapture => {
                self.authorized.insert(id.clone(), payment.created_at);
            }
            // Journals from before captures existed say nothing of the amount captured.
            PaymentStatus::Succeeded => payment.amount_captured = payment.amount_minor,
            _ => {}
        }
        // Only the books' view adds it, pointing at where this process is reachable.
        payment.next_action = None;
        self.payments.insert(id, payment);
    }

    fn commit_refund(&mut self, idempotency_key: String, request: RefundRequest, refund: Refund) {
        let Some(payment) = self.payments.get_mut(&refund.payment_id) else {
            return;
        };
        self.refunds.insert(
            refund.id.clone(),
            (payment.id.clone(), payment.refunds.len()),
        );
        self.refund_keys.insert(
            idempotency_key,
            RefundClaim {
                payment_id: payment.id.clone(),
                request,
                refund_id: refund.id.clone(),
            },
        );
        self.refund_order.insert(Position {
            created_at: refund.created_at,
            id: refund.id.clone(),
        });
        let created_at = refund.created_at;
        payment.refunds.push(refund);
        self.tick(created_at);
    }

    /// Moves the clock up to `created_at` (never back).
    fn tick(&mut self, created_at: DateTime<Utc>) {
        self.clock = Some(
            self.clock
                .map_or(created_at, |latest| latest.max(created_at)),
        );
    }
}
