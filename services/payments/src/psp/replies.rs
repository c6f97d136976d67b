//! What the provider answers: a payment with its refunds and disputes, a
//! page of its listing, and the fact soldonce learns from a payment.

use serde::Deserialize;
use uuid::Uuid;

/// A payment as the provider reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct PspPayment {
    pub id: String,
    pub status: String,
    pub amount_minor: i64,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
    /// The key it was created with: soldonce's own are `pay:<order_id>`.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// Why an authorization ended uncaptured (`requested`, `abandoned`, `expired`).
    #[serde(default)]
    pub cancellation_reason: Option<String>,
    /// How much the provider has taken (0 while only authorized).
    #[serde(default)]
    pub amount_captured: Option<i64>,
    /// Where the buyer must act, while the payment `requires_action`.
    #[serde(default)]
    pub next_action: Option<NextAction>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(default)]
    pub refunds: Vec<PspRefund>,
    /// Disputes (chargebacks) of it, as the provider lists them.
    #[serde(default)]
    pub disputes: Vec<PspDispute>,
}

/// A dispute as the provider lists it on its payment.
#[derive(Debug, Clone, Deserialize)]
pub struct PspDispute {
    pub id: String,
    pub amount_minor: i64,
    #[serde(default)]
    pub reason: String,
}

impl PspPayment {
    /// The fact soldonce learns from this payment.
    pub fn fact(&self) -> store::payments::PaymentFact {
        store::payments::PaymentFact {
            payment_id: self.id.clone(),
            order_id: store::payments::own_order(
                self.reference.as_deref(),
                self.idempotency_key.as_deref(),
            ),
            status: domain::PspStatus::parse(&self.status),
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            failure_reason: self.failure_reason.clone().or_else(|| {
                self.cancellation_reason
                    .as_ref()
                    .map(|r| format!("canceled ({r})"))
            }),
            abandoned: self.cancellation_reason.as_deref() == Some("abandoned"),
            next_action_url: self.next_action.as_ref().map(|a| a.url.clone()),
        }
    }

    /// The fact of a payment soldonce asked for with `pay:<order_id>` itself
    /// (its charge, or a lookup by that key): its own, whatever the reply echoes.
    pub fn fact_for(&self, order_id: Uuid) -> store::payments::PaymentFact {
        store::payments::PaymentFact {
            order_id: Some(order_id),
            ..self.fact()
        }
    }

    /// How much of it the provider has given back.
    pub fn refunded_minor(&self) -> i64 {
        self.refunds
            .iter()
            .filter(|r| r.status == "succeeded")
            .fold(0i64, |sum, r| sum.saturating_add(r.amount_minor))
    }
}

/// A payment's `next_action`: the page where the buyer completes 3-D Secure.
#[derive(Debug, Clone, Deserialize)]
pub struct NextAction {
    pub url: String,
}

/// A refund as the provider reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct PspRefund {
    pub id: String,
    pub status: String,
    pub amount_minor: i64,
}

/// One page of the provider's payment listing.
#[derive(Debug, Clone, Deserialize)]
pub struct PaymentPage {
    pub data: Vec<PspPayment>,
    pub has_more: bool,
    #[serde(default)]
    pub next_cursor: Option<String>,
}
