//! The changes the books are made of. Each [`Entry`] is first checked against the books, then
//! committed; live requests and journal replay take the same two steps, so a replayed journal
//! rebuilds exactly the books that wrote it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{remaining, Ledger, Position, RefundClaim};
use crate::model::{FailureReason, Payment, PaymentRequest, PaymentStatus, Refund, RefundRequest};

/// One change to the books, as journaled: one JSON object per line, tagged by `entry`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
pub enum Entry {
    /// A new payment, final or `processing`.
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
}

/// How a payment ends, decided by the decline roll when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The money is taken.
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

    /// The payment status this outcome ends in.
    pub fn status(self) -> PaymentStatus {
        match self {
            Outcome::Succeeded => PaymentStatus::Succeeded,
            Outcome::Failed => PaymentStatus::Failed,
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

/// An entry that does not fit the books it is applied to (a damaged or edited journal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Inconsistent(String);

fn inconsistent(reason: String) -> Result<(), Inconsistent> {
    Err(Inconsistent(reason))
}

impl Ledger {
    /// Whether `entry` fits the books as they are; changes nothing.
    pub(super) fn check(&self, entry: &Entry) -> Result<(), Inconsistent> {
        match entry {
            Entry::PaymentCreated {
                payment, outcome, ..
            } => {
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
                    PaymentStatus::Processing => payment.failure_reason.is_none(),
                    status => {
                        status == outcome.status()
                            && payment.failure_reason == outcome.failure_reason()
                    }
                };
                if !fits || !payment.refunds.is_empty() {
                    return inconsistent(format!(
                        "payment {} does not match its outcome",
                        payment.id
                    ));
                }
                Ok(())
            }
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
                let Some(payment) = self.payments.get(&refund.payment_id) else {
                    return inconsistent(format!(
                        "refund {} is for unknown payment {}",
                        refund.id, refund.payment_id
                    ));
                };
                if payment.status != PaymentStatus::Succeeded {
                    return inconsistent(format!(
                        "refund {} is for payment {}, which has not succeeded",
                        refund.id, payment.id
                    ));
                }
                if !(1..=remaining(payment)).contains(&refund.amount_minor) {
                    return inconsistent(format!(
                        "refund {} exceeds what is left of payment {}",
                        refund.id, payment.id
                    ));
                }
                Ok(())
            }
        }
    }

    /// Applies an entry that [`Ledger::check`] accepted.
    pub(super) fn commit(&mut self, entry: Entry) {
        match entry {
            Entry::PaymentCreated {
                payment,
                request,
                outcome,
            } => {
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
                if payment.status == PaymentStatus::Processing {
                    self.unsettled.insert(id.clone(), outcome);
                }
                self.payments.insert(id, payment);
            }
            Entry::PaymentSettled { payment_id, .. } => {
                let outcome = self.unsettled.remove(&payment_id);
                if let (Some(outcome), Some(payment)) =
                    (outcome, self.payments.get_mut(&payment_id))
                {
                    payment.status = outcome.status();
                    payment.failure_reason = outcome.failure_reason();
                }
            }
            Entry::RefundCreated {
                idempotency_key,
                request,
                refund,
            } => {
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
        }
    }

    /// Moves the clock up to `created_at` (never back).
    fn tick(&mut self, created_at: DateTime<Utc>) {
        self.clock = Some(
            self.clock
                .map_or(created_at, |latest| latest.max(created_at)),
        );
    }
}
