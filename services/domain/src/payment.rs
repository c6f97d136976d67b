//! What the payment provider tells us, and what soldonce decides about it.
//! A payment the PSP reports as succeeded ends attached to exactly one
//! confirmed order or refunded: `decide_paid` picks which, before anything
//! is called, so the decision can commit with the fact that prompted it.
//! Only `succeeded` confirms and only `failed` declines; every other status
//! is an unknown outcome, resolved by asking the PSP by key.

use crate::error::DomainError;
use crate::event::Event;
use crate::state::{Capture, Order, OrderState};
pub use crate::state::{RefundReason, RefundRef};
use chrono::{DateTime, Utc};

/// A payment's status as the PSP reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PspStatus {
    /// The money was taken.
    Succeeded,
    /// The money is held for a later capture (`requires_capture`): it
    /// confirms like a success, and is captured when the order ships.
    Authorized,
    /// A definite refusal (`failed`), or an authorization that ended
    /// without a capture (`canceled`: voided, abandoned, lapsed): the only
    /// statuses that decline.
    Failed,
    /// The buyer must act first (`requires_action`, 3-D Secure): the order
    /// waits for the buyer, its reservation extended once.
    ActionRequired,
    /// Anything else (`processing`, an unknown word): ask again by key.
    Unknown(String),
}

impl PspStatus {
    /// Reads the PSP's status word.
    pub fn parse(status: &str) -> PspStatus {
        match status {
            "succeeded" => PspStatus::Succeeded,
            "requires_capture" => PspStatus::Authorized,
            "failed" | "canceled" => PspStatus::Failed,
            "requires_action" => PspStatus::ActionRequired,
            other => PspStatus::Unknown(other.chars().take(64).collect()),
        }
    }

    /// Whether the payment settles an order: taken, or held for a capture.
    pub fn is_paid(&self) -> bool {
        matches!(self, PspStatus::Succeeded | PspStatus::Authorized)
    }
}

/// A payment the PSP reports as succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidFact {
    pub payment_id: String,
    pub amount_minor: i64,
    /// As the PSP spelled it; compared with the order's, never trusted.
    pub currency: String,
    /// Whether the money was taken (`succeeded`) or only held for a capture
    /// (`requires_capture`): a held payment that cannot settle its order is
    /// voided, not refunded.
    pub captured: bool,
    pub at: DateTime<Utc>,
}

/// Decides what a succeeded payment does to `order`. `units_gone` says the
/// store already tried to reclaim an expired order's units and found them
/// sold. Nothing here ever refunds the payment an order is confirmed on,
/// and nothing confirms on a payment whose refund is decided.
pub(crate) fn decide_paid(
    order: &Order,
    fact: PaidFact,
    units_gone: bool,
    holdings: &[crate::limits::Holding],
) -> Result<Vec<Event>, DomainError> {
    let attached = order.state == OrderState::Confirmed
        && order
            .payment
            .as_ref()
            .is_some_and(|p| p.payment_id == fact.payment_id);
    if attached || order.refund_of(&fact.payment_id).is_some() {
        return Ok(vec![]);
    }
    let mismatch = if fact.currency != order.currency.as_str() {
        Some(RefundReason::CurrencyMismatch)
    } else if fact.amount_minor != order.total_minor {
        Some(RefundReason::AmountMismatch)
    } else {
        None
    };
    let refund = |reason: RefundReason| {
        Ok(vec![Event::RefundDecided {
            payment_id: fact.payment_id.clone(),
            amount_minor: fact.amount_minor,
            currency: fact.currency.clone(),
            reason,
            void: !fact.captured,
            at: fact.at,
        }])
    };
    let confirm = |reactivated| {
        Ok(vec![Event::Confirmed {
            payment_id: fact.payment_id.clone(),
            amount_minor: fact.amount_minor,
            reactivated,
            uncaptured: !fact.captured,
            at: fact.at,
        }])
    };
    match (order.state, mismatch) {
        (_, Some(reason)) => refund(reason),
        (OrderState::PaymentPending, None) => confirm(false),
        (OrderState::Expired, None) if units_gone => refund(RefundReason::UnitsGone),
        (OrderState::Expired, None) if crate::limits::revival_breaks(order, holdings).is_some() => {
            refund(RefundReason::OverLimit)
        }
        (OrderState::Expired, None) => confirm(true),
        (OrderState::Cancelled, None) => refund(RefundReason::Cancelled),
        (OrderState::PaymentFailed, None) => refund(RefundReason::AfterDecline),
        (OrderState::Confirmed | OrderState::Refunded, None) => refund(RefundReason::SecondPayment),
    }
}

/// Records that the PSP confirmed the refund of `payment_id`; only a
/// decided refund can be recorded.
pub(crate) fn decide_refunded(
    order: &Order,
    payment_id: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    match order.refund_of(payment_id) {
        Some(r) if r.refunded => Ok(vec![]),
        Some(r) => Ok(vec![Event::Refunded {
            payment_id: r.payment_id.clone(),
            amount_minor: r.amount_minor,
            void: r.void,
            at,
        }]),
        None => Err(DomainError::NoRefundDecided(payment_id.to_owned())),
    }
}

/// Folds a refund event into the order.
pub(crate) fn evolve_refund(order: &mut Order, event: &Event) {
    match event {
        Event::RefundDecided {
            payment_id,
            amount_minor,
            currency,
            reason,
            void,
            ..
        } => order.refunds.push(RefundRef {
            payment_id: payment_id.clone(),
            amount_minor: *amount_minor,
            currency: currency.clone(),
            reason: *reason,
            refunded: false,
            void: *void,
        }),
        // A voided authorization took nothing: the order keeps its state.
        Event::Refunded {
            payment_id,
            void: true,
            ..
        } => {
            if let Some(r) = order
                .refunds
                .iter_mut()
                .find(|r| &r.payment_id == payment_id)
            {
                r.refunded = true;
            }
        }
        Event::Refunded {
            payment_id,
            amount_minor,
            ..
        } => {
            match order
                .refunds
                .iter_mut()
                .find(|r| &r.payment_id == payment_id)
            {
                Some(r) => r.refunded = true,
                // Recorded before refunds were decided first: a late payment on an ended order.
                None => order.refunds.push(RefundRef {
                    payment_id: payment_id.clone(),
                    amount_minor: *amount_minor,
                    currency: order.currency.to_string(),
                    reason: RefundReason::UnitsGone,
                    refunded: true,
                    void: false,
                }),
            }
            if matches!(
                order.state,
                OrderState::Cancelled | OrderState::Expired | OrderState::PaymentFailed
            ) {
                order.state = OrderState::Refunded;
                order.payment = Some(crate::state::PaymentRef {
                    payment_id: payment_id.clone(),
                    amount_minor: *amount_minor,
                    capture: Capture::Automatic,
                });
            }
        }
        _ => {}
    }
}

/// The order's goods left: capture its authorized payment, once. Nothing to
/// do for a payment captured at once, or a capture already decided.
pub(crate) fn decide_capture(order: &Order, at: DateTime<Utc>) -> Vec<Event> {
    match &order.payment {
        Some(p) if p.capture == Capture::Authorized => vec![Event::CaptureDecided {
            payment_id: p.payment_id.clone(),
            amount_minor: p.amount_minor,
            at,
        }],
        _ => vec![],
    }
}

/// Records that the PSP confirmed the decided capture of `payment_id`.
pub(crate) fn decide_captured(
    order: &Order,
    payment_id: &str,
    amount_minor: i64,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    match &order.payment {
        Some(p) if p.payment_id == payment_id && p.capture == Capture::Captured => Ok(vec![]),
        Some(p) if p.payment_id == payment_id && p.capture == Capture::Decided => {
            Ok(vec![Event::Captured {
                payment_id: payment_id.to_owned(),
                amount_minor,
                at,
            }])
        }
        _ => Err(DomainError::NoCaptureDecided(payment_id.to_owned())),
    }
}

/// Folds a capture event into the order.
pub(crate) fn evolve_capture(order: &mut Order, event: &Event) {
    let Some(payment) = order.payment.as_mut() else {
        return;
    };
    match event {
        Event::CaptureDecided { .. } => payment.capture = Capture::Decided,
        Event::Captured { amount_minor, .. } => {
            payment.capture = Capture::Captured;
            payment.amount_minor = *amount_minor;
        }
        _ => {}
    }
}
