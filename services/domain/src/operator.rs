//! What an operator asks of a confirmed order: a refund of part or all of
//! what its payment took, once per key. Asking again with the same key and
//! amount decides nothing; the refunds of one payment never add up to more
//! than it took.

use crate::order::{Capture, DomainError, Event, Order};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A refund an operator asked for, by its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRefund {
    /// The operator's idempotency key: one refund per key, per order.
    pub key: String,
    pub payment_id: String,
    pub amount_minor: i64,
    /// Whether the PSP has confirmed it.
    pub refunded: bool,
}

/// Longest operator refund key accepted, in characters.
pub const MAX_KEY_CHARS: usize = 128;

/// Decides an operator's refund of `amount_minor` under `key`.
pub(crate) fn decide_refund(
    order: &Order,
    key: &str,
    amount_minor: i64,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    if key.is_empty() || key.chars().count() > MAX_KEY_CHARS || key.chars().any(char::is_control) {
        return Err(DomainError::InvalidRefund(format!(
            "the key must be 1 to {MAX_KEY_CHARS} printable characters"
        )));
    }
    if let Some(asked) = order.operator_refunds.iter().find(|r| r.key == key) {
        return if asked.amount_minor == amount_minor {
            Ok(vec![])
        } else {
            Err(DomainError::InvalidRefund(format!(
                "key {key:?} already asked for a refund of {}",
                asked.amount_minor
            )))
        };
    }
    let Some(payment) = &order.payment else {
        return Err(DomainError::NothingCaptured);
    };
    if !matches!(payment.capture, Capture::Automatic | Capture::Captured) {
        return Err(DomainError::NothingCaptured);
    }
    if amount_minor < 1 {
        return Err(DomainError::InvalidRefund(
            "the amount must be at least 1".into(),
        ));
    }
    let asked: i64 = order
        .operator_refunds
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.amount_minor));
    let left = payment.amount_minor.saturating_sub(asked).max(0);
    if amount_minor > left {
        return Err(DomainError::RefundExceedsCaptured {
            asked: amount_minor,
            left,
        });
    }
    Ok(vec![Event::OperatorRefundDecided {
        key: key.to_owned(),
        payment_id: payment.payment_id.clone(),
        amount_minor,
        at,
    }])
}

/// Records that the PSP confirmed the operator refund under `key`.
pub(crate) fn decide_refunded(
    order: &Order,
    key: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    match order.operator_refunds.iter().find(|r| r.key == key) {
        Some(r) if r.refunded => Ok(vec![]),
        Some(r) => Ok(vec![Event::OperatorRefunded {
            key: r.key.clone(),
            payment_id: r.payment_id.clone(),
            amount_minor: r.amount_minor,
            at,
        }]),
        None => Err(DomainError::NoRefundDecided(key.to_owned())),
    }
}

/// Folds an operator refund event into the order.
pub(crate) fn evolve(order: &mut Order, event: &Event) {
    match event {
        Event::OperatorRefundDecided {
            key,
            payment_id,
            amount_minor,
            ..
        } => order.operator_refunds.push(OperatorRefund {
            key: key.clone(),
            payment_id: payment_id.clone(),
            amount_minor: *amount_minor,
            refunded: false,
        }),
        Event::OperatorRefunded { key, .. } => {
            if let Some(r) = order.operator_refunds.iter_mut().find(|r| &r.key == key) {
                r.refunded = true;
            }
        }
        _ => {}
    }
}
