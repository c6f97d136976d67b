//! What the PSP reported about a payment, which path heard it, and what
//! became of it.

use domain::{Order, PspStatus, RefundReason};
use uuid::Uuid;

/// Which path learned a fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Worker,
    Webhook,
    Lookup,
    Reconcile,
    /// A free order, settled without a PSP.
    Free,
}

impl Source {
    /// The column and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Worker => "worker",
            Source::Webhook => "webhook",
            Source::Lookup => "lookup",
            Source::Reconcile => "reconcile",
            Source::Free => "free",
        }
    }
}

/// What the PSP reported about one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFact {
    pub payment_id: String,
    /// The order soldonce made the payment for ([`own_order`](crate::payments::own_order)); `None` for
    /// a payment soldonce did not make.
    pub order_id: Option<Uuid>,
    pub status: PspStatus,
    pub amount_minor: i64,
    pub currency: String,
    pub failure_reason: Option<String>,
    /// The buyer left the payment's 3-D Secure challenge unfinished (the
    /// PSP canceled it, reason `abandoned`): its order expires.
    pub abandoned: bool,
    /// Where the buyer must act, for a payment that `requires_action`.
    pub next_action_url: Option<String>,
}

/// What became of a fact.
#[derive(Debug, Clone, PartialEq)]
pub enum Learned {
    /// The order is confirmed on the payment (`reclaimed`: an expired order's units were taken back).
    Confirmed { order: Order, reclaimed: bool },
    /// The payment is to be refunded; the compensation is recorded.
    RefundDecided(RefundReason),
    /// A definite failure declined the order.
    Declined(Order),
    /// Nothing new: the payment's disposition was decided before, the
    /// failure no longer applies, or a free order's settlement came after
    /// its order ended (no money to give back).
    AlreadyKnown,
    /// Not a clear answer: ask the PSP again by key. Nothing was changed.
    Unknown(String),
    /// The payment waits for the buyer's action (3-D Secure); the order
    /// waits with it (its reservation extended once, if this is news).
    AwaitingAction,
    /// Not soldonce's payment: made without its key, or for an order it
    /// does not hold. Nothing was recorded; it is never refunded.
    Foreign,
}
