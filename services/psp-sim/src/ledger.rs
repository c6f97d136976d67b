//! The simulator's books: payments and refunds in memory, with idempotency keys. Pure and
//! synchronous; randomness and time come in as arguments.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::model::{
    new_payment_id, new_refund_id, FailureReason, Payment, PaymentRequest, PaymentStatus, Refund,
    RefundRequest, RefundStatus,
};

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
    /// The refund asks for more than is left.
    #[error("refund of {requested} exceeds the {remaining} left to refund")]
    ExceedsRemaining {
        /// Amount asked for.
        requested: i64,
        /// Amount not yet refunded.
        remaining: i64,
    },
}

#[derive(Debug)]
struct RefundClaim {
    payment_id: String,
    request: RefundRequest,
    refund_id: String,
}

/// Payments by id, with indexes by idempotency key and by reference.
#[derive(Debug, Default)]
pub struct Ledger {
    payments: HashMap<String, Payment>,
    payment_keys: HashMap<String, (PaymentRequest, String)>,
    references: HashMap<String, Vec<String>>,
    refund_keys: HashMap<String, RefundClaim>,
}

impl Ledger {
    /// Charges once per key: a repeat with the same request returns the first payment.
    pub fn charge(
        &mut self,
        key: &str,
        request: PaymentRequest,
        declined: bool,
        now: DateTime<Utc>,
    ) -> Result<Recorded<Payment>, LedgerError> {
        if let Some((earlier, payment_id)) = self.payment_keys.get(key) {
            if *earlier != request {
                return Err(LedgerError::KeyReused);
            }
            return self
                .payments
                .get(payment_id)
                .cloned()
                .map(Recorded::Replayed)
                .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.clone()));
        }
        let payment = Payment {
            id: new_payment_id(),
            status: if declined {
                PaymentStatus::Failed
            } else {
                PaymentStatus::Succeeded
            },
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            reference: request.reference.clone(),
            idempotency_key: key.to_owned(),
            failure_reason: declined.then_some(FailureReason::CardDeclined),
            created_at: now,
            refunds: Vec::new(),
        };
        self.payment_keys
            .insert(key.to_owned(), (request, payment.id.clone()));
        self.references
            .entry(payment.reference.clone())
            .or_default()
            .push(payment.id.clone());
        self.payments.insert(payment.id.clone(), payment.clone());
        Ok(Recorded::Created(payment))
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
                .payments
                .get(payment_id)
                .and_then(|p| p.refunds.iter().find(|r| r.id == claim.refund_id))
                .cloned()
                .map(Recorded::Replayed)
                .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()));
        }
        let payment = self
            .payments
            .get_mut(payment_id)
            .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()))?;
        if payment.status == PaymentStatus::Failed {
            return Err(LedgerError::PaymentFailed(payment_id.to_owned()));
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
            created_at: now,
        };
        payment.refunds.push(refund.clone());
        self.refund_keys.insert(
            key.to_owned(),
            RefundClaim {
                payment_id: payment_id.to_owned(),
                request,
                refund_id: refund.id.clone(),
            },
        );
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
}

/// What is left to refund; refunds never exceed the amount, so this never goes negative.
fn remaining(payment: &Payment) -> i64 {
    let refunded = payment
        .refunds
        .iter()
        .fold(0_i64, |sum, r| sum.saturating_add(r.amount_minor));
    payment.amount_minor.saturating_sub(refunded)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn request(amount_minor: i64, reference: &str) -> PaymentRequest {
        PaymentRequest {
            amount_minor,
            currency: "BRL".to_owned(),
            reference: reference.to_owned(),
        }
    }

    fn created<T: std::fmt::Debug>(recorded: Recorded<T>) -> T {
        match recorded {
            Recorded::Created(value) => value,
            other => panic!("expected Created, got {other:?}"),
        }
    }

    fn charged(ledger: &mut Ledger, key: &str, amount: i64) -> Payment {
        created(
            ledger
                .charge(key, request(amount, "ord_1"), false, Utc::now())
                .unwrap(),
        )
    }

    #[test]
    fn the_same_key_and_request_replays_the_first_payment() {
        let mut ledger = Ledger::default();
        let first = charged(&mut ledger, "k", 100);
        let again = ledger.charge("k", request(100, "ord_1"), true, Utc::now());
        assert_eq!(again, Ok(Recorded::Replayed(first)));
        assert_eq!(ledger.payments_for_reference("ord_1").len(), 1);
    }

    #[test]
    fn the_same_key_with_another_request_is_refused() {
        let mut ledger = Ledger::default();
        charged(&mut ledger, "k", 100);
        let again = ledger.charge("k", request(101, "ord_1"), false, Utc::now());
        assert_eq!(again, Err(LedgerError::KeyReused));
    }

    #[test]
    fn a_declined_charge_is_failed_with_a_reason() {
        let mut ledger = Ledger::default();
        let payment = created(
            ledger
                .charge("k", request(5, "o"), true, Utc::now())
                .unwrap(),
        );
        assert_eq!(payment.status, PaymentStatus::Failed);
        assert_eq!(payment.failure_reason, Some(FailureReason::CardDeclined));
        let refund = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
        assert_eq!(refund, Err(LedgerError::PaymentFailed(payment.id)));
    }

    #[test]
    fn refunds_stop_at_the_amount_paid() {
        let mut ledger = Ledger::default();
        let payment = charged(&mut ledger, "k", 100);
        let part = RefundRequest {
            amount_minor: Some(60),
        };
        created(
            ledger
                .refund(&payment.id, "r1", part.clone(), Utc::now())
                .unwrap(),
        );
        let too_much = ledger.refund(&payment.id, "r2", part, Utc::now());
        assert_eq!(
            too_much,
            Err(LedgerError::ExceedsRemaining {
                requested: 60,
                remaining: 40
            })
        );
        let rest = created(
            ledger
                .refund(&payment.id, "r3", RefundRequest::default(), Utc::now())
                .unwrap(),
        );
        assert_eq!(rest.amount_minor, 40);
        let nothing_left = ledger.refund(&payment.id, "r4", RefundRequest::default(), Utc::now());
        assert!(matches!(
            nothing_left,
            Err(LedgerError::ExceedsRemaining { remaining: 0, .. })
        ));
    }

    #[test]
    fn a_refund_key_replays_and_refuses_other_requests() {
        let mut ledger = Ledger::default();
        let payment = charged(&mut ledger, "k", 100);
        let refund = created(
            ledger
                .refund(&payment.id, "r", RefundRequest::default(), Utc::now())
                .unwrap(),
        );
        let again = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
        assert_eq!(again, Ok(Recorded::Replayed(refund)));
        let other = RefundRequest {
            amount_minor: Some(1),
        };
        let reused = ledger.refund(&payment.id, "r", other, Utc::now());
        assert_eq!(reused, Err(LedgerError::KeyReused));
        assert_eq!(ledger.payment(&payment.id).unwrap().refunds.len(), 1);
    }

    #[test]
    fn an_unknown_payment_cannot_be_refunded() {
        let mut ledger = Ledger::default();
        let refund = ledger.refund("pay_x", "r", RefundRequest::default(), Utc::now());
        assert_eq!(
            refund,
            Err(LedgerError::PaymentNotFound("pay_x".to_owned()))
        );
    }
}
