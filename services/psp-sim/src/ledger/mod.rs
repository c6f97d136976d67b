//! The simulator's books: payments, refunds and disputes with their idempotency keys, indexed
//! by reference and by creation time. Which change each status allows is in `rules`; the
//! changes after creation (capture, cancel, the buyer's action, expiry, disputes) in
//! `lifecycle`. Event-sourced: every change is an [`Entry`] that is
//! checked, appended to the [`Journal`] (when the books have one), and only then applied;
//! replaying a journal's entries rebuilds the same books. Synchronous; randomness and time
//! come in as arguments.

mod change;
mod entry;
pub mod journal;
mod lifecycle;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod lifecycle_tests;
mod page;
mod rules;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use chrono::{DateTime, TimeDelta, Utc};

use crate::model::{
    new_payment_id, new_refund_id, CaptureRequest, NextAction, NextActionType, Payment,
    PaymentRequest, PaymentStatus, Refund, RefundRequest, RefundStatus,
};

pub use entry::{Entry, Inconsistent, Outcome};
pub use journal::{Journal, JournalError};
pub use page::{Page, PageRequest, Position};

/// Whether a POST did something new or repeated an earlier answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded<T> {
    /// First time this key was seen: the effect happened now.
    Created(T),
    /// The key was seen before with the same request: nothing new happened.
    Replayed(T),
}

/// Why the books refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The idempotency key was used before with a different request.
    #[error("the idempotency key was already used with a different request")]
    KeyReused,
    /// No payment has this id.
    #[error("no payment has id {0}")]
    PaymentNotFound(String),
    /// A failed or canceled payment took no money and never will, so none can go back.
    #[error("payment {payment_id} is {status}; there is nothing to refund")]
    NotRefundable {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
    },
    /// A payment not captured (yet) has taken no money to give back.
    #[error("payment {payment_id} is {status}: nothing is captured; refund it once captured")]
    NotCaptured {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
    },
    /// A processing payment has taken no money yet and cannot be changed until it settles.
    #[error("payment {0} is still processing; try again once it has settled")]
    PaymentProcessing(String),
    /// Only a `requires_capture` payment can be captured.
    #[error("payment {payment_id} is {status}; only a requires_capture payment can be captured")]
    NotCapturable {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
    },
    /// The capture asks for more than was authorized.
    #[error("capture of {requested} exceeds the {authorized} authorized")]
    CaptureExceedsAuthorized {
        /// Amount asked for.
        requested: i64,
        /// Amount authorized.
        authorized: i64,
    },
    /// Only a `requires_action` or `requires_capture` payment can be canceled.
    #[error(
        "payment {payment_id} is {status}; only a requires_action or requires_capture \
         payment can be canceled"
    )]
    NotCancelable {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
    },
    /// The buyer can only act on a `requires_action` payment.
    #[error("payment {payment_id} is {status}; it is not awaiting the buyer's action")]
    NotAwaitingAction {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
    },
    /// Only captured money that is neither refunded nor disputed can be disputed.
    #[error("payment {payment_id} is {status} with {remaining} captured, not refunded and not disputed; nothing to dispute")]
    NotDisputable {
        /// The payment.
        payment_id: String,
        /// Its status.
        status: PaymentStatus,
        /// What is captured, not refunded and not disputed.
        remaining: i64,
    },
    /// The dispute asks for more than is left.
    #[error(
        "dispute of {requested} exceeds the {remaining} captured, not refunded and not disputed"
    )]
    DisputeExceedsRemaining {
        /// Amount asked for.
        requested: i64,
        /// Amount left.
        remaining: i64,
    },
    /// The refund asks for more than is left (captured, less refunded and disputed).
    #[error("refund of {requested} exceeds the {remaining} left to refund")]
    ExceedsRemaining {
        /// Amount asked for.
        requested: i64,
        /// Amount not yet refunded.
        remaining: i64,
    },
    /// The change could not be journaled (or did not fit the books); nothing changed.
    #[error("the books could not be written: {0}")]
    Storage(String),
}

/// What the caller rolled for a new payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roll {
    /// How it ends: at once, or when it settles.
    pub outcome: Outcome,
    /// Whether it starts as `processing` and settles later.
    pub processing: bool,
    /// Whether it starts as `requires_action` (then `outcome` and `processing` do not apply).
    pub action_required: bool,
}

#[derive(Debug)]
struct RefundClaim {
    payment_id: String,
    request: RefundRequest,
    refund_id: String,
}

/// What a capture or cancel key was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ChangeClaim {
    payment_id: String,
    change: KeyedChange,
}

/// A merchant's keyed change to a payment.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyedChange {
    Capture(CaptureRequest),
    Cancel,
}

/// Payments by id, with indexes by idempotency key, by reference and by creation time.
#[derive(Debug, Default)]
pub struct Ledger {
    payments: HashMap<String, Payment>,
    payment_keys: HashMap<String, (PaymentRequest, String)>,
    references: HashMap<String, Vec<String>>,
    refund_keys: HashMap<String, RefundClaim>,
    /// Capture and cancel keys (one namespace).
    change_keys: HashMap<String, ChangeClaim>,
    /// Payments `requires_capture`, and when each was authorized.
    authorized: HashMap<String, DateTime<Utc>>,
    /// Dispute ids.
    disputes: HashSet<String>,
    /// Where `next_action` URLs point: `<base>/v1/payments/{id}/action`.
    public_url: Option<String>,
    /// Refund id → its payment's id and its place in that payment's refunds.
    refunds: HashMap<String, (String, usize)>,
    payment_order: BTreeSet<Position>,
    refund_order: BTreeSet<Position>,
    /// Payments still `processing`, and how each will settle.
    unsettled: HashMap<String, Outcome>,
    /// The latest creation time handed out; every new one is later, so listings never miss
    /// what is created while a client pages through them.
    clock: Option<DateTime<Utc>>,
    journal: Option<Journal>,
}

impl Ledger {
    /// The books kept in `dir`: rebuilt by replaying its journal, which then records every
    /// change. Memory-only books are [`Ledger::default`].
    pub fn open(dir: &Path) -> Result<Self, JournalError> {
        let (journal, entries) = Journal::open(dir)?;
        let mut ledger = Self::default();
        let replayed = entries.len();
        for (line, entry) in entries {
            ledger
                .apply(entry)
                .map_err(|inconsistent| journal.corrupt(line, inconsistent.to_string()))?;
        }
        tracing::info!(
            dir = %dir.display(),
            entries = replayed,
            payments = ledger.payments.len(),
            refunds = ledger.refunds.len(),
            processing = ledger.unsettled.len(),
            "books replayed from the journal"
        );
        ledger.journal = Some(journal);
        Ok(ledger)
    }

    /// Applies one entry, as replay does, after checking that it fits the books.
    pub fn apply(&mut self, entry: Entry) -> Result<(), Inconsistent> {
        self.check(&entry)?;
        self.commit(entry);
        Ok(())
    }

    /// Charges once per key: a repeat with the same request returns the payment as it is now.
    pub fn charge(
        &mut self,
        key: &str,
        request: PaymentRequest,
        roll: Roll,
        now: DateTime<Utc>,
    ) -> Result<Recorded<Payment>, LedgerError> {
        if let Some((earlier, payment_id)) = self.payment_keys.get(key) {
            if *earlier != request {
                return Err(LedgerError::KeyReused);
            }
            return self
                .payment(payment_id)
                .map(Recorded::Replayed)
                .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.clone()));
        }
        let method = request.capture_method;
        let (status, failure_reason) = if roll.action_required {
            (PaymentStatus::RequiresAction, None)
        } else if roll.processing {
            (PaymentStatus::Processing, None)
        } else {
            (roll.outcome.status(method), roll.outcome.failure_reason())
        };
        let amount_captured = match status {
            PaymentStatus::Succeeded => request.amount_minor,
            _ => 0,
        };
        let payment = Payment {
            id: new_payment_id(),
            status,
            capture_method: method,
            amount_minor: request.amount_minor,
            amount_captured,
            currency: request.currency.clone(),
            reference: request.reference.clone(),
            idempotency_key: key.to_owned(),
            failure_reason,
            cancellation_reason: None,
            next_action: None,
            created_at: self.next_time(now),
            refunds: Vec::new(),
            disputes: Vec::new(),
        };
        let id = payment.id.clone();
        self.record(Entry::PaymentCreated {
            payment,
            request,
            outcome: roll.outcome,
        })?;
        self.payment(&id)
            .map(Recorded::Created)
            .ok_or(LedgerError::PaymentNotFound(id))
    }

    /// Settles a `processing` payment as rolled at its creation, returning it settled; `None`
    /// when it is not processing (already settled, or unknown).
    pub fn settle(
        &mut self,
        payment_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Payment>, LedgerError> {
        if !self.unsettled.contains_key(payment_id) {
            return Ok(None);
        }
        self.record(Entry::PaymentSettled {
            payment_id: payment_id.to_owned(),
            settled_at: now,
        })?;
        Ok(self.payment(payment_id))
    }

    /// Refunds once per key; without an amount, everything not yet refunded.
    pub fn refund(
        &mut self,
        payment_id: &str,
        key: &str,
        request: RefundRequest,
        now: DateTime<Utc>,
    ) -> Result<Recorded<Refund>, LedgerError> {
        if let Some(claim) = self.refund_keys.get(key) {
            if claim.payment_id != payment_id || claim.request != request {
                return Err(LedgerError::KeyReused);
            }
            return self
                .refund_by_id(&claim.refund_id)
                .map(Recorded::Replayed)
                .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()));
        }
        let payment = self
            .payments
            .get(payment_id)
            .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()))?;
        let requested = rules::may_refund(payment, request.amount_minor)?;
        let refund = Refund {
            id: new_refund_id(),
            payment_id: payment_id.to_owned(),
            amount_minor: requested,
            status: RefundStatus::Succeeded,
            created_at: self.next_time(now),
        };
        self.record(Entry::RefundCreated {
            idempotency_key: key.to_owned(),
            request,
            refund: refund.clone(),
        })?;
        Ok(Recorded::Created(refund))
    }

    /// Points `next_action` URLs at `base` (e.g. `http://127.0.0.1:8090`).
    pub fn set_public_url(&mut self, base: &str) {
        self.public_url = Some(base.trim_end_matches('/').to_owned());
    }

    /// The payment with this id, with its `next_action` while it awaits the buyer.
    pub fn payment(&self, id: &str) -> Option<Payment> {
        let mut payment = self.payments.get(id)?.clone();
        if payment.status == PaymentStatus::RequiresAction {
            let base = self.public_url.as_deref().unwrap_or("");
            payment.next_action = Some(NextAction {
                action_type: NextActionType::RedirectToUrl,
                url: format!("{base}/v1/payments/{id}/action"),
            });
        }
        Some(payment)
    }

    /// The payment created with this idempotency key.
    pub fn payment_by_key(&self, key: &str) -> Option<Payment> {
        let (_, id) = self.payment_keys.get(key)?;
        self.payment(id)
    }

    /// Every payment made with this reference, oldest first.
    pub fn payments_for_reference(&self, reference: &str) -> Vec<Payment> {
        self.references
            .get(reference)
            .into_iter()
            .flatten()
            .filter_map(|id| self.payment(id))
            .collect()
    }

    /// The refund with this id.
    pub fn refund_by_id(&self, id: &str) -> Option<Refund> {
        let (payment_id, index) = self.refunds.get(id)?;
        self.payments.get(payment_id)?.refunds.get(*index).cloned()
    }

    /// One page of payments in `(created_at, id)` order; costs the page, not the books.
    pub fn payments_page(&self, request: &PageRequest) -> Page<Payment> {
        page::page(&self.payment_order, request, |id| self.payment(id))
    }

    /// One page of refunds in `(created_at, id)` order.
    pub fn refunds_page(&self, request: &PageRequest) -> Page<Refund> {
        page::page(&self.refund_order, request, |id| self.refund_by_id(id))
    }

    /// The ids of payments still `processing`, oldest first.
    pub fn unsettled(&self) -> Vec<String> {
        let mut unsettled: Vec<(DateTime<Utc>, &String)> = self
            .unsettled
            .keys()
            .filter_map(|id| Some((self.payments.get(id)?.created_at, id)))
            .collect();
        unsettled.sort();
        unsettled.into_iter().map(|(_, id)| id.clone()).collect()
    }

    /// Checks, journals, then applies: the journal never holds what the books refused, and
    /// the books never hold what the journal lacks.
    fn record(&mut self, entry: Entry) -> Result<(), LedgerError> {
        self.check(&entry)
            .map_err(|inconsistent| LedgerError::Storage(inconsistent.to_string()))?;
        if let Some(journal) = &mut self.journal {
            journal
                .append(&entry)
                .map_err(|error| LedgerError::Storage(error.to_string()))?;
        }
        self.commit(entry);
        Ok(())
    }

    /// `now`, or just after the latest creation time if the clock has not moved past it.
    fn next_time(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self.clock {
            Some(latest) if now <= latest => latest + TimeDelta::nanoseconds(1),
            _ => now,
        }
    }
}
