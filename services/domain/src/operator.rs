//! What an operator asks of a confirmed order: a refund of part or all of
//! what its payment took, once per key, or a cancel before its goods leave.
//! Asking again with the same key and amount decides nothing; the refunds
//! of one payment never add up to more than it took. A cancel gives the
//! units back and the money with them: an authorization is voided, money
//! taken is refunded (what earlier refunds left), both as an operator
//! refund under [`CANCEL_KEY`].

use crate::error::DomainError;
use crate::event::Event;
pub use crate::state::OperatorRefund;
use crate::state::{Capture, Order, OrderState};
use chrono::{DateTime, Utc};

/// Longest operator refund key accepted, in characters.
pub const MAX_KEY_CHARS: usize = 128;
/// The key of the refund or void an operator's cancel decides.
pub const CANCEL_KEY: &str = "soldonce:cancel";
/// Keys soldonce keeps for itself: an operator's may not start with it.
const RESERVED_PREFIX: &str = "soldonce:";
/// Longest cancel reason accepted, in characters.
pub const MAX_REASON_CHARS: usize = 200;

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
    if key.starts_with(RESERVED_PREFIX) {
        return Err(DomainError::InvalidRefund(format!(
            "keys starting with {RESERVED_PREFIX:?} are soldonce's own"
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
    let left = payment.amount_minor.saturating_sub(asked(order)).max(0);
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
        void: false,
        at,
    }])
}

/// Decides an operator's cancel of `order`. A pending order is cancelled
/// as a buyer would; a confirmed one only while its goods have not left
/// (`shipped`, or a capture decided, says they have). A disputed payment's
/// money is the bank's and the dispute's to settle: the cancel gives none
/// of it back (the finding stays for a person), so a held order can still
/// end. Cancelling again changes nothing.
pub(crate) fn decide_cancel(
    order: &Order,
    shipped: bool,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    if reason.chars().count() > MAX_REASON_CHARS || reason.chars().any(char::is_control) {
        return Err(DomainError::InvalidCancel(format!(
            "the reason must be at most {MAX_REASON_CHARS} printable characters"
        )));
    }
    let payment = match (order.state, &order.payment) {
        (OrderState::PaymentPending, _) => return Ok(vec![Event::Cancelled { at }]),
        // Only an operator's cancel leaves a payment on a cancelled order.
        (OrderState::Cancelled, Some(_)) => return Ok(vec![]),
        (OrderState::Confirmed, Some(payment)) => payment,
        (from, _) => {
            return Err(DomainError::IllegalTransition {
                from,
                action: "cancel",
            })
        }
    };
    if shipped || matches!(payment.capture, Capture::Decided | Capture::Captured) {
        return Err(DomainError::GoodsLeft);
    }
    let mut events = vec![Event::OperatorCancelled {
        reason: reason.to_owned(),
        at,
    }];
    let disputed = order
        .disputes
        .iter()
        .any(|d| d.payment_id == payment.payment_id);
    let (amount_minor, void) = match payment.capture {
        _ if disputed => (0, false),
        Capture::Authorized => (payment.amount_minor, true),
        _ => (
            payment.amount_minor.saturating_sub(asked(order)).max(0),
            false,
        ),
    };
    if amount_minor > 0 {
        events.push(Event::OperatorRefundDecided {
            key: CANCEL_KEY.to_owned(),
            payment_id: payment.payment_id.clone(),
            amount_minor,
            void,
            at,
        });
    }
    Ok(events)
}

/// What operators asked to refund of the order's payment so far.
fn asked(order: &Order) -> i64 {
    order
        .operator_refunds
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.amount_minor))
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
            void: r.void,
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
            void,
            ..
        } => {
            order.operator_refunds.push(OperatorRefund {
                key: key.clone(),
                payment_id: payment_id.clone(),
                amount_minor: *amount_minor,
                refunded: false,
                void: *void,
            });
            if let Some(p) = order.payment.as_mut().filter(|_| *void) {
                p.capture = Capture::Voided;
            }
        }
        Event::OperatorRefunded { key, .. } => {
            if let Some(r) = order.operator_refunds.iter_mut().find(|r| &r.key == key) {
                r.refunded = true;
            }
        }
        _ => {}
    }
}
