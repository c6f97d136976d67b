//! What happens to a payment after it is created: the merchant captures or cancels it (once
//! per idempotency key), the buyer completes its 3-D Secure step, its authorization expires,
//! or the buyer's bank disputes it. Each is one journaled [`Entry`].

use chrono::{DateTime, Utc};

use super::{rules, ChangeClaim, Entry, KeyedChange, Ledger, LedgerError, Recorded};
use crate::model::{
    new_dispute_id, ActionOutcome, CancellationReason, CaptureRequest, Dispute, DisputeRequest,
    DisputeStatus, Payment,
};

impl Ledger {
    /// Captures a `requires_capture` payment once per key; without an amount, all of it.
    pub fn capture(
        &mut self,
        payment_id: &str,
        key: &str,
        request: CaptureRequest,
        now: DateTime<Utc>,
    ) -> Result<Recorded<Payment>, LedgerError> {
        let change = KeyedChange::Capture(request.clone());
        if let Some(replayed) = self.replay_change(payment_id, key, change)? {
            return Ok(Recorded::Replayed(replayed));
        }
        let amount_captured = rules::may_capture(self.existing(payment_id)?, request.amount_minor)?;
        self.record(Entry::PaymentCaptured {
            payment_id: payment_id.to_owned(),
            idempotency_key: key.to_owned(),
            request,
            amount_captured,
            captured_at: now,
        })?;
        self.changed(payment_id).map(Recorded::Created)
    }

    /// Cancels (voids) a payment awaiting the buyer or its capture, once per key.
    pub fn cancel(
        &mut self,
        payment_id: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<Recorded<Payment>, LedgerError> {
        if let Some(replayed) = self.replay_change(payment_id, key, KeyedChange::Cancel)? {
            return Ok(Recorded::Replayed(replayed));
        }
        rules::may_cancel(self.existing(payment_id)?)?;
        self.record(Entry::PaymentCanceled {
            payment_id: payment_id.to_owned(),
            idempotency_key: Some(key.to_owned()),
            reason: CancellationReason::Requested,
            canceled_at: now,
        })?;
        self.changed(payment_id).map(Recorded::Created)
    }

    /// The buyer ends the 3-D Secure step of a `requires_action` payment.
    pub fn act(
        &mut self,
        payment_id: &str,
        outcome: ActionOutcome,
        now: DateTime<Utc>,
    ) -> Result<Payment, LedgerError> {
        rules::may_act(self.existing(payment_id)?)?;
        self.record(Entry::ActionCompleted {
            payment_id: payment_id.to_owned(),
            outcome,
            completed_at: now,
        })?;
        self.changed(payment_id)
    }

    /// Cancels a payment whose authorization lapsed, returning it; `None` when it is no longer
    /// `requires_capture` (captured or canceled meanwhile, or unknown).
    pub fn expire(
        &mut self,
        payment_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Payment>, LedgerError> {
        if !self.authorized.contains_key(payment_id) {
            return Ok(None);
        }
        self.record(Entry::PaymentCanceled {
            payment_id: payment_id.to_owned(),
            idempotency_key: None,
            reason: CancellationReason::Expired,
            canceled_at: now,
        })?;
        Ok(self.payment(payment_id))
    }

    /// Opens a dispute taking back captured money; without an amount, all that is left.
    pub fn dispute(
        &mut self,
        payment_id: &str,
        request: DisputeRequest,
        now: DateTime<Utc>,
    ) -> Result<Dispute, LedgerError> {
        let amount_minor = rules::may_dispute(self.existing(payment_id)?, request.amount_minor)?;
        let dispute = Dispute {
            id: new_dispute_id(),
            payment_id: payment_id.to_owned(),
            amount_minor,
            reason: request.reason,
            status: DisputeStatus::NeedsResponse,
            created_at: now,
        };
        self.record(Entry::DisputeCreated {
            dispute: dispute.clone(),
        })?;
        Ok(dispute)
    }

    /// Payments `requires_capture`, each with when it was authorized, oldest first.
    pub fn awaiting_capture(&self) -> Vec<(String, DateTime<Utc>)> {
        let mut awaiting: Vec<(String, DateTime<Utc>)> = self
            .authorized
            .iter()
            .map(|(id, at)| (id.clone(), *at))
            .collect();
        awaiting.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        awaiting
    }

    /// The payment as it is now if `key` already made this change to it; refused if the key
    /// made another change (or changed another payment).
    fn replay_change(
        &self,
        payment_id: &str,
        key: &str,
        change: KeyedChange,
    ) -> Result<Option<Payment>, LedgerError> {
        let Some(claim) = self.change_keys.get(key) else {
            return Ok(None);
        };
        let asked = ChangeClaim {
            payment_id: payment_id.to_owned(),
            change,
        };
        if *claim != asked {
            return Err(LedgerError::KeyReused);
        }
        self.changed(payment_id).map(Some)
    }

    fn existing(&self, payment_id: &str) -> Result<&Payment, LedgerError> {
        self.payments
            .get(payment_id)
            .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()))
    }

    fn changed(&self, payment_id: &str) -> Result<Payment, LedgerError> {
        self.payment(payment_id)
            .ok_or_else(|| LedgerError::PaymentNotFound(payment_id.to_owned()))
    }
}
