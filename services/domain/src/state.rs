//! An order's state: what every event of one order folds into, with the
//! payments, refunds, actions and disputes recorded on it. Plain data, no
//! decisions: the deciders and `order.rs` read and change it.

use crate::money::Currency;
use crate::stock::{Quantity, Sku};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most lines one order may have.
pub const MAX_LINES: usize = 100;

/// Where an order is in the saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    PaymentPending,
    Confirmed,
    PaymentFailed,
    Cancelled,
    Expired,
    Refunded,
}

impl OrderState {
    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderState::PaymentPending => "payment_pending",
            OrderState::Confirmed => "confirmed",
            OrderState::PaymentFailed => "payment_failed",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
            OrderState::Refunded => "refunded",
        }
    }

    /// Whether the order's units sit in the `reserved` bucket.
    pub fn holds_reservation(self) -> bool {
        self == OrderState::PaymentPending
    }
}

impl std::fmt::Display for OrderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of an order, priced from the catalogue when it was placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub sku: Sku,
    pub quantity: Quantity,
    pub unit_price_minor: i64,
}

/// A delivery address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shipping {
    pub name: String,
    pub line1: String,
    pub city: String,
    pub postal_code: String,
    pub country: String,
}

/// The payment that settled an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRef {
    pub payment_id: String,
    pub amount_minor: i64,
    /// Where the money is: taken at once, or authorized and captured later.
    #[serde(default)]
    pub capture: Capture,
}

/// Whether an order's payment has taken the money yet. A payment made
/// with automatic capture took it when it succeeded; an authorization
/// (`CAPTURE_AT=shipment`) holds it until a capture is decided (when the
/// order ships) and the PSP confirms it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capture {
    /// Captured by the PSP when the payment succeeded.
    #[default]
    Automatic,
    /// Authorized; nothing taken yet.
    Authorized,
    /// The capture is decided and owed: the payment worker carries it out.
    Decided,
    /// The PSP confirmed the capture.
    Captured,
    /// The authorization is to be voided, or was: its order was cancelled
    /// by an operator before its goods left. Nothing is ever taken.
    Voided,
}

impl Capture {
    /// The projection's column value: `None` for [`Capture::Automatic`].
    pub fn column(self) -> Option<&'static str> {
        match self {
            Capture::Automatic => None,
            Capture::Authorized => Some("authorized"),
            Capture::Decided => Some("decided"),
            Capture::Captured => Some("captured"),
            Capture::Voided => Some("voided"),
        }
    }

    /// Reads the projection's column value.
    pub fn from_column(value: Option<&str>) -> Option<Capture> {
        match value {
            None => Some(Capture::Automatic),
            Some("authorized") => Some(Capture::Authorized),
            Some("decided") => Some(Capture::Decided),
            Some("captured") => Some(Capture::Captured),
            Some("voided") => Some(Capture::Voided),
            Some(_) => None,
        }
    }
}

/// The state every event of one order folds into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: Uuid,
    pub account_id: Uuid,
    pub state: OrderState,
    pub lines: Vec<OrderLine>,
    pub currency: Currency,
    pub total_minor: i64,
    pub shipping: Option<Shipping>,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub payment: Option<PaymentRef>,
    /// Refunds decided against payments that could not settle this order.
    pub refunds: Vec<RefundRef>,
    /// Refunds an operator asked for, of the payment the order stands on.
    #[serde(default)]
    pub operator_refunds: Vec<OperatorRefund>,
    /// The buyer's action a payment waits for (3-D Secure), once asked.
    #[serde(default)]
    pub next_action: Option<NextAction>,
    /// Disputes (chargebacks) the PSP reported against its payments.
    #[serde(default)]
    pub disputes: Vec<DisputeRef>,
    /// How many events the order has: the version the next one must follow.
    pub version: i32,
}

impl Order {
    /// Whether a matching payment arriving now would take the order's units
    /// back from available (an expired order): the store must then say
    /// whether they are still there (`Command::Paid { units_gone }`).
    pub fn payment_would_reclaim(&self) -> bool {
        self.state == OrderState::Expired
    }

    /// The refund decided for this payment, if any.
    pub fn refund_of(&self, payment_id: &str) -> Option<&RefundRef> {
        self.refunds.iter().find(|r| r.payment_id == payment_id)
    }
}

/// Why a payment is refunded rather than attached to its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    /// The buyer cancelled before the charge landed: a cancel is final.
    Cancelled,
    /// The order expired and its units were sold to someone else.
    UnitsGone,
    /// The PSP charged another amount than the order's total.
    AmountMismatch,
    /// The PSP charged in another currency than the order's.
    CurrencyMismatch,
    /// The order is already settled by another payment.
    SecondPayment,
    /// The order's payment had already failed definitively.
    AfterDecline,
    /// The payment's reference names no order of ours.
    NoSuchOrder,
    /// Reviving the expired order would break a per-account limit: the
    /// buyer holds as many as allowed in orders since.
    OverLimit,
}

impl RefundReason {
    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            RefundReason::Cancelled => "cancelled",
            RefundReason::UnitsGone => "units_gone",
            RefundReason::AmountMismatch => "amount_mismatch",
            RefundReason::CurrencyMismatch => "currency_mismatch",
            RefundReason::SecondPayment => "second_payment",
            RefundReason::AfterDecline => "after_decline",
            RefundReason::NoSuchOrder => "no_such_order",
            RefundReason::OverLimit => "over_limit",
        }
    }
}

/// A refund decided against one of the order's payments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRef {
    pub payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub reason: RefundReason,
    /// Whether the PSP has confirmed the refund.
    pub refunded: bool,
    /// An uncaptured authorization, voided rather than refunded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub void: bool,
}

/// A refund an operator asked for, by its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRefund {
    /// The operator's idempotency key: one refund per key, per order.
    pub key: String,
    pub payment_id: String,
    pub amount_minor: i64,
    /// Whether the PSP has confirmed it.
    pub refunded: bool,
    /// An authorization voided (a cancel), not money refunded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub void: bool,
}

/// What the buyer must do for the order's payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextAction {
    pub payment_id: String,
    /// Where the buyer completes the challenge.
    pub url: String,
}

/// A dispute the PSP reported against one of the order's payments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisputeRef {
    /// The PSP's dispute id (`dp_…`).
    pub dispute_id: String,
    pub payment_id: String,
    /// The amount the bank took back, in the order's minor units.
    pub amount_minor: i64,
    /// Why, in the PSP's words (`fraudulent`, `product_not_received`, …).
    pub reason: String,
    pub at: DateTime<Utc>,
}
