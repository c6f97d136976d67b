//! Order events: what happened to an order, each with its stable type
//! name and version, its stored form and the stock movement it causes.

use crate::money::Currency;
use crate::state::{OrderLine, RefundReason, Shipping};
use crate::stock::Movement;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `skip_serializing_if` for flags that old events never carried.
fn is_false(flag: &bool) -> bool {
    !*flag
}

/// Something that happened to an order. The serde tag is the event's stable
/// type name and version; it never changes once shipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum Event {
    #[serde(rename = "order.placed.v1")]
    Placed {
        order_id: Uuid,
        account_id: Uuid,
        lines: Vec<OrderLine>,
        currency: Currency,
        total_minor: i64,
        shipping: Option<Shipping>,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.confirmed.v1")]
    Confirmed {
        payment_id: String,
        amount_minor: i64,
        reactivated: bool,
        /// The payment is an authorization: the money is taken by a
        /// capture when the order ships. Absent (false) on payments
        /// captured at once, and on every event written before.
        #[serde(default, skip_serializing_if = "is_false")]
        uncaptured: bool,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.payment_failed.v1")]
    PaymentFailed {
        payment_id: Option<String>,
        reason: String,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.cancelled.v1")]
    Cancelled { at: DateTime<Utc> },
    #[serde(rename = "order.expired.v1")]
    Expired { at: DateTime<Utc> },
    /// A payment that cannot settle the order is to be refunded; decided
    /// before the PSP is called, so nothing can confirm on it afterwards.
    #[serde(rename = "order.refund_decided.v1")]
    RefundDecided {
        payment_id: String,
        amount_minor: i64,
        currency: String,
        reason: RefundReason,
        /// The payment is an uncaptured authorization: it is voided (no
        /// money moved), not refunded.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed a decided refund (or void).
    #[serde(rename = "order.refunded.v1")]
    Refunded {
        payment_id: String,
        amount_minor: i64,
        /// The authorization was voided: nothing had been taken.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The order shipped: its authorized payment is to be captured. Decided
    /// before the PSP is called, once per order, so nothing can void it after.
    #[serde(rename = "order.capture_decided.v1")]
    CaptureDecided {
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed the decided capture: the money is taken.
    #[serde(rename = "order.captured.v1")]
    Captured {
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// An operator asked to refund part or all of what the order's payment
    /// took, under their key; carried out by the payment worker.
    #[serde(rename = "order.operator_refund_decided.v1")]
    OperatorRefundDecided {
        key: String,
        payment_id: String,
        amount_minor: i64,
        /// The payment is an uncaptured authorization: it is voided (an
        /// operator's cancel), not refunded.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// An operator cancelled the order after it was confirmed, before its
    /// goods left: its units go back on sale; the money is given back by
    /// the `order.operator_refund_decided` that follows.
    #[serde(rename = "order.operator_cancelled.v1")]
    OperatorCancelled { reason: String, at: DateTime<Utc> },
    /// A payment waits for the buyer's action (3-D Secure) at `url`; the
    /// reservation now lasts until `expires_at`.
    #[serde(rename = "order.action_required.v1")]
    ActionRequired {
        payment_id: String,
        url: String,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed an operator's refund.
    #[serde(rename = "order.operator_refunded.v1")]
    OperatorRefunded {
        key: String,
        payment_id: String,
        amount_minor: i64,
        /// The authorization was voided: nothing had been taken.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The buyer's bank took money back from one of the order's payments (see `dispute.rs`).
    #[serde(rename = "order.disputed.v1")]
    Disputed {
        dispute_id: String,
        payment_id: String,
        amount_minor: i64,
        reason: String,
        at: DateTime<Utc>,
    },
    /// Money of the order's payment was refunded outside soldonce (at the
    /// PSP's dashboard, by another system): named to a person, its
    /// shipment held; the order keeps its state.
    #[serde(rename = "order.refunded_elsewhere.v1")]
    RefundedElsewhere {
        refund_id: String,
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
}

impl Event {
    /// The stable type name with its version, e.g. `order.placed.v1`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Placed { .. } => "order.placed.v1",
            Event::Confirmed { .. } => "order.confirmed.v1",
            Event::PaymentFailed { .. } => "order.payment_failed.v1",
            Event::Cancelled { .. } => "order.cancelled.v1",
            Event::Expired { .. } => "order.expired.v1",
            Event::RefundDecided { .. } => "order.refund_decided.v1",
            Event::Refunded { .. } => "order.refunded.v1",
            Event::CaptureDecided { .. } => "order.capture_decided.v1",
            Event::Captured { .. } => "order.captured.v1",
            Event::OperatorRefundDecided { .. } => "order.operator_refund_decided.v1",
            Event::OperatorRefunded { .. } => "order.operator_refunded.v1",
            Event::OperatorCancelled { .. } => "order.operator_cancelled.v1",
            Event::ActionRequired { .. } => "order.action_required.v1",
            Event::Disputed { .. } => "order.disputed.v1",
            Event::RefundedElsewhere { .. } => "order.refunded_elsewhere.v1",
        }
    }

    /// The stock movement this event causes on its order's lines, if any:
    /// the one rule the store applies.
    pub fn movement(&self) -> Option<Movement> {
        match self {
            Event::Placed { .. } => Some(Movement::Reserve),
            Event::Confirmed {
                reactivated: false, ..
            } => Some(Movement::Confirm),
            Event::Confirmed {
                reactivated: true, ..
            } => Some(Movement::Reclaim),
            Event::PaymentFailed { .. } | Event::Cancelled { .. } | Event::Expired { .. } => {
                Some(Movement::Release)
            }
            Event::OperatorCancelled { .. } => Some(Movement::Restock),
            Event::RefundDecided { .. }
            | Event::Refunded { .. }
            | Event::CaptureDecided { .. }
            | Event::Captured { .. }
            | Event::OperatorRefundDecided { .. }
            | Event::OperatorRefunded { .. }
            | Event::ActionRequired { .. } => None,
            Event::Disputed { .. } | Event::RefundedElsewhere { .. } => None,
        }
    }

    /// The event's payload without its tag, as stored in `events.data`.
    pub fn data(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut m)) => m.remove("data").unwrap_or_default(),
            _ => serde_json::Value::Null,
        }
    }

    /// Rebuilds an event from its stored type name and payload.
    pub fn from_parts(
        type_name: &str,
        data: serde_json::Value,
    ) -> Result<Event, serde_json::Error> {
        serde_json::from_value(serde_json::json!({ "type": type_name, "data": data }))
    }

    /// When the event happened.
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            Event::Placed { at, .. }
            | Event::Confirmed { at, .. }
            | Event::PaymentFailed { at, .. }
            | Event::Cancelled { at }
            | Event::Expired { at }
            | Event::RefundDecided { at, .. }
            | Event::Refunded { at, .. }
            | Event::CaptureDecided { at, .. }
            | Event::Captured { at, .. }
            | Event::OperatorRefundDecided { at, .. }
            | Event::OperatorRefunded { at, .. }
            | Event::OperatorCancelled { at, .. }
            | Event::ActionRequired { at, .. } => *at,
            Event::Disputed { at, .. } | Event::RefundedElsewhere { at, .. } => *at,
        }
    }
}
