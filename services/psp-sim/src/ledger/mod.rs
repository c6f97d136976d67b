//! The simulator's books: payments and refunds with their idempotency keys, indexed by
//! reference and by creation time. Event-sourced: every change is an [`Entry`] that is
//! checked, appended to the [`Journal`] (when the books have one), and only then applied;
//! replaying a journal's entries rebuilds the same books. Synchronous; randomness and time
//! come in as arguments.

mod entry;
pub mod journal;
mod page;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use chrono::{DateTime, TimeDelta, Utc};

use crate::model::{
    new_payment_id, new_refund_id, Payment, PaymentRequest, PaymentStatus, Refund, RefundRequest,
    RefundStatus,
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
    /// A failed payment took no money, so none can go back.
    #[error("payment {0} failed; there is nothing to refund")]
    PaymentFailed(String),
    /// A processing payment has taken no money yet.
    #[error("payment {0} is still processing; refund it once it has succeeded")]
    PaymentProcessing(String),
    /// The refund asks for more than is left.
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
}

#[derive(Debug)]
struct RefundClaim {
    payment_id: String,
    request: RefundRequest,
    refund_id: String,
}

/// Payments by id, with indexes by idempotency key, by reference and by creation time.
#[derive(Debug, Default)]
pub struct Ledger {
    payments: HashMap<String, Payment>,
    payment_keys: HashMap<String, (PaymentRequest, String)>,
    references: HashMap<String, Vec<String>>,
    refund_keys: HashMap<String, RefundClaim>,
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
        let (status, failure_reason) = if roll.processing {
            (PaymentStatus::Processing, None)
        } else {
            (roll.outcome.status(), roll.outcome.failure_reason())
        };
        let payment = Payment {
            id: new_payment_id(),
            status,
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            reference: request.reference.clone(),
            idempotency_key: key.to_owned(),
            failure_reason,
            created_at: self.next_time(now),
            refunds: Vec::new(),
        };
        self.record(Entry::PaymentCreated {
            payment: payment.clone(),
            request,
            outcome: roll.outcome,
        })?;
        Ok(Recorded::Created(payment))
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
        match payment.status {
            PaymentStatus::Succeeded => {}
            PaymentStatus::Failed => return Err(LedgerError::PaymentFailed(payment_id.to_owned())),
            PaymentStatus::Processing => {
                return Err(LedgerError::PaymentProcessing(payment_id.to_owned()))
            }
        }
        let remaining = remaining(payment);
        let requested = request.amount_minor.unwrap_or(remaining);
        if requested > remaining || requested < 1 {
            return Err(LedgerError::ExceedsRemaining {
                requested,
                remaining,
            });
        }
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

    /// The payment with this id.
    pub fn payment(&self, id: &str) -> Option<Payment> {
        self.payments.get(id).cloned()
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

/// What is left to refund; refunds never exceed the amount, so this never goes negative.
fn remaining(payment: &Payment) -> i64 {
    let refunded = payment
        .refunds
        .iter()
        .fold(0_i64, |sum, r| sum.saturating_add(r.amount_minor));
    payment.amount_minor.saturating_sub(refunded)
}
