//! The order as the API shows it; `POST`, `GET` and cancel return this shape.

use chrono::{DateTime, Utc};
use domain::{Order, Shipping};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One line as shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineView {
    pub sku: String,
    pub quantity: i64,
    pub unit_price_minor: i64,
}

/// The payment that settled the order, once there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentView {
    /// `authorized` (held, captured when the order ships), `succeeded`
    /// (taken), or `refunded`.
    pub state: String,
    pub amount_minor: i64,
    pub psp_payment_id: String,
    /// While `state` is `requires_action`: where the buyer completes 3-D Secure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<NextActionView>,
}

/// Where the buyer must act for the order's payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextActionView {
    pub url: String,
}

/// A refund decided against a payment that could not settle the order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundView {
    pub psp_payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    /// Why the payment could not settle the order, e.g. `cancelled`.
    pub reason: String,
    /// `pending` until the PSP confirms the refund, then `refunded`; an
    /// uncaptured authorization ends `voided` (nothing had been taken).
    pub state: String,
}

/// A dispute (chargeback) of one of the order's payments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisputeView {
    /// The PSP's dispute id.
    pub id: String,
    pub psp_payment_id: String,
    /// What the buyer's bank took back.
    pub amount_minor: i64,
    /// Why, in the PSP's words.
    pub reason: String,
    pub opened_at: DateTime<Utc>,
}

/// A shipment as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShipmentView {
    pub id: Uuid,
    pub state: String,
}

impl From<store::shipments::Shipment> for ShipmentView {
    fn from(s: store::shipments::Shipment) -> Self {
        ShipmentView {
            id: s.id,
            state: s.state.as_str().to_owned(),
        }
    }
}

/// The order resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderView {
    pub id: Uuid,
    pub state: String,
    pub lines: Vec<LineView>,
    pub total_minor: i64,
    pub currency: String,
    pub shipping: Option<Shipping>,
    pub payment: Option<PaymentView>,
    /// Payments that could not settle the order, and their refunds; then
    /// the refunds operators asked for (and an operator cancel's void).
    pub refunds: Vec<RefundView>,
    /// Disputes of its payments, oldest first.
    pub disputes: Vec<DisputeView>,
    /// The shipment, once fulfillment created one.
    pub shipment: Option<ShipmentView>,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<&Order> for OrderView {
    fn from(o: &Order) -> Self {
        OrderView {
            id: o.id,
            state: o.state.as_str().to_owned(),
            lines: o
                .lines
                .iter()
                .map(|l| LineView {
                    sku: l.sku.to_string(),
                    quantity: l.quantity.get(),
                    unit_price_minor: l.unit_price_minor,
                })
                .collect(),
            total_minor: o.total_minor,
            currency: o.currency.to_string(),
            shipping: o.shipping.clone(),
            payment: o
                .payment
                .as_ref()
                .map(|p| PaymentView {
                    next_action: None,
                    state: match p.capture {
                        _ if o.state == domain::OrderState::Refunded => "refunded",
                        domain::Capture::Authorized | domain::Capture::Decided => "authorized",
                        domain::Capture::Automatic | domain::Capture::Captured => "succeeded",
                        domain::Capture::Voided => "voided",
                    }
                    .into(),
                    amount_minor: p.amount_minor,
                    psp_payment_id: p.payment_id.clone(),
                })
                .or_else(|| awaiting_action(o)),
            refunds: o
                .refunds
                .iter()
                .map(|r| RefundView {
                    psp_payment_id: r.payment_id.clone(),
                    amount_minor: r.amount_minor,
                    currency: r.currency.clone(),
                    reason: r.reason.as_str().to_owned(),
                    state: refund_state(r.refunded, r.void).into(),
                })
                .chain(o.operator_refunds.iter().map(|r| {
                    RefundView {
                        psp_payment_id: r.payment_id.clone(),
                        amount_minor: r.amount_minor,
                        currency: o.currency.to_string(),
                        reason: if r.key == domain::operator::CANCEL_KEY {
                            "operator_cancel"
                        } else {
                            "operator"
                        }
                        .into(),
                        state: refund_state(r.refunded, r.void).into(),
                    }
                }))
                .collect(),
            disputes: o
                .disputes
                .iter()
                .map(|d| DisputeView {
                    id: d.dispute_id.clone(),
                    psp_payment_id: d.payment_id.clone(),
                    amount_minor: d.amount_minor,
                    reason: d.reason.clone(),
                    opened_at: d.at,
                })
                .collect(),
            shipment: None,
            expires_at: o.expires_at,
            created_at: o.created_at,
            updated_at: o.updated_at,
        }
    }
}

/// A refund's `state`: `pending` until the PSP confirms it.
fn refund_state(confirmed: bool, void: bool) -> &'static str {
    match (confirmed, void) {
        (false, _) => "pending",
        (true, false) => "refunded",
        (true, true) => "voided",
    }
}

/// A pending order's payment while it waits for the buyer's 3-D Secure action.
fn awaiting_action(o: &Order) -> Option<PaymentView> {
    let action = o.next_action.as_ref()?;
    (o.state == domain::OrderState::PaymentPending).then(|| PaymentView {
        state: "requires_action".into(),
        amount_minor: o.total_minor,
        psp_payment_id: action.payment_id.clone(),
        next_action: Some(NextActionView {
            url: action.url.clone(),
        }),
    })
}
