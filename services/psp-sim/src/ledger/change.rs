//! Checking and committing the changes made to a payment after its creation: capture, cancel,
//! the buyer's action and disputes. The checks are the live requests' rules (see `rules`), so
//! a journal holds only changes those rules allowed.

use super::entry::{inconsistent, Inconsistent};
use super::{rules, ChangeClaim, Entry, KeyedChange, Ledger};
use crate::model::{CancellationReason, PaymentStatus};

impl Ledger {
    /// Whether a later change fits the books; changes nothing.
    pub(super) fn check_change(&self, entry: &Entry) -> Result<(), Inconsistent> {
        let refused = |error: super::LedgerError| Inconsistent(error.to_string());
        match entry {
            Entry::PaymentCaptured {
                payment_id,
                idempotency_key,
                request,
                amount_captured,
                ..
            } => {
                self.check_key_unused(idempotency_key)?;
                let payment = self.known(payment_id)?;
                let amount = rules::may_capture(payment, request.amount_minor).map_err(refused)?;
                if amount != *amount_captured {
                    return inconsistent(format!(
                        "payment {payment_id}: captured {amount_captured}, but the request says {amount}"
                    ));
                }
                Ok(())
            }
            Entry::PaymentCanceled {
                payment_id,
                idempotency_key,
                reason,
                ..
            } => {
                let payment = self.known(payment_id)?;
                match (reason, idempotency_key) {
                    (CancellationReason::Requested, Some(key)) => {
                        self.check_key_unused(key)?;
                        rules::may_cancel(payment).map_err(refused)
                    }
                    (CancellationReason::Expired, None)
                        if payment.status == PaymentStatus::RequiresCapture =>
                    {
                        Ok(())
                    }
                    _ => inconsistent(format!(
                        "payment {payment_id} cannot be canceled as {reason:?} with key {idempotency_key:?} while {}",
                        payment.status
                    )),
                }
            }
            Entry::ActionCompleted { payment_id, .. } => {
                rules::may_act(self.known(payment_id)?).map_err(refused)
            }
            Entry::DisputeCreated { dispute } => {
                if self.disputes.contains(&dispute.id) {
                    return inconsistent(format!("dispute {} already exists", dispute.id));
                }
                let payment = self.known(&dispute.payment_id)?;
                rules::may_dispute(payment, Some(dispute.amount_minor))
                    .map(drop)
                    .map_err(refused)
            }
            // The entries of creation are checked by `check`.
            Entry::PaymentCreated { .. }
            | Entry::PaymentSettled { .. }
            | Entry::RefundCreated { .. } => Ok(()),
        }
    }

    fn check_key_unused(&self, key: &str) -> Result<(), Inconsistent> {
        if self.change_keys.contains_key(key) {
            return inconsistent(format!(
                "idempotency key {key:?} already captured or canceled a payment"
            ));
        }
        Ok(())
    }

    /// Applies a later change that [`Ledger::check_change`] accepted.
    pub(super) fn commit_change(&mut self, entry: Entry) {
        match entry {
            Entry::PaymentCaptured {
                payment_id,
                idempotency_key,
                request,
                amount_captured,
                ..
            } => {
                self.claim(idempotency_key, &payment_id, KeyedChange::Capture(request));
                self.authorized.remove(&payment_id);
                if let Some(payment) = self.payments.get_mut(&payment_id) {
                    payment.status = PaymentStatus::Succeeded;
                    payment.amount_captured = amount_captured;
                }
            }
            Entry::PaymentCanceled {
                payment_id,
                idempotency_key,
                reason,
                ..
            } => {
                if let Some(key) = idempotency_key {
                    self.claim(key, &payment_id, KeyedChange::Cancel);
                }
                self.cancel_now(&payment_id, reason);
            }
            Entry::ActionCompleted {
                payment_id,
                outcome,
                completed_at,
            } => self.act_on(&payment_id, outcome, completed_at),
            Entry::DisputeCreated { dispute } => {
                if let Some(payment) = self.payments.get_mut(&dispute.payment_id) {
                    self.disputes.insert(dispute.id.clone());
                    payment.disputes.push(dispute);
                }
            }
            Entry::PaymentCreated { .. }
            | Entry::PaymentSettled { .. }
            | Entry::RefundCreated { .. } => {}
        }
    }

    fn claim(&mut self, key: String, payment_id: &str, change: KeyedChange) {
        let claim = ChangeClaim {
            payment_id: payment_id.to_owned(),
            change,
        };
        self.change_keys.insert(key, claim);
    }
}
