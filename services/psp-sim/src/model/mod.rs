//! The PSP's resources as they appear on the wire: payments (with the statuses and fields of
//! Stripe's PaymentIntents), refunds, disputes and the requests that create or change them.

mod request;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use request::{
    ActionOutcome, ActionRequest, CancelRequest, CaptureRequest, DisputeRequest, InvalidRequest,
    PaymentRequest, RefundRequest,
};

/// Longest `reference` accepted, in characters.
pub const MAX_REFERENCE_CHARS: usize = 255;
/// What every payment id starts with.
pub const PAYMENT_ID_PREFIX: &str = "pay_";
/// What every refund id starts with.
pub const REFUND_ID_PREFIX: &str = "re_";
/// What every dispute id starts with.
pub const DISPUTE_ID_PREFIX: &str = "dp_";

/// Where a payment is in its life, as Stripe's PaymentIntents name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Waiting for the buyer (a 3-D Secure step, decided by `action_required_rate`): see
    /// `next_action`, completed through `POST /v1/payments/{id}/action`.
    RequiresAction,
    /// Not decided yet (decided by `processing_rate`); settles after `processing_ms`.
    Processing,
    /// Authorized (`capture_method: manual`): the money is held until captured, canceled or
    /// the authorization expires (`authorization_ttl_ms`).
    RequiresCapture,
    /// The money was taken (`amount_captured` of it).
    Succeeded,
    /// Voided before any money was taken; see `cancellation_reason`.
    Canceled,
    /// The charge was refused; nothing was taken; see `failure_reason`.
    Failed,
}

impl PaymentStatus {
    /// The wire name, e.g. `requires_capture`.
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::RequiresAction => "requires_action",
            PaymentStatus::Processing => "processing",
            PaymentStatus::RequiresCapture => "requires_capture",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Canceled => "canceled",
            PaymentStatus::Failed => "failed",
        }
    }
}

impl std::fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When the money of an authorized payment is taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    /// At once, when the payment is authorized.
    #[default]
    Automatic,
    /// Only through `POST /v1/payments/{id}/capture`; until then `requires_capture`.
    Manual,
}

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The issuer said no (decided by `decline_rate`).
    CardDeclined,
    /// The buyer failed the 3-D Secure step (`/action` with `failed`).
    AuthenticationFailed,
}

/// Why a payment was canceled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    /// The merchant canceled it (`POST /v1/payments/{id}/cancel`).
    Requested,
    /// The buyer abandoned the 3-D Secure step (`/action` with `abandoned`).
    Abandoned,
    /// The authorization lapsed before it was captured (`authorization_ttl_ms`).
    Expired,
}

/// What the buyer must do next; present only while `requires_action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextAction {
    /// Always `redirect_to_url`.
    #[serde(rename = "type")]
    pub action_type: NextActionType,
    /// Where the buyer goes: `<base>/v1/payments/{id}/action`.
    pub url: String,
}

/// The kinds of next action; the simulator only redirects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextActionType {
    /// Send the buyer to `url`.
    RedirectToUrl,
}

/// A refund's outcome; the simulator only ever succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// The money went back.
    Succeeded,
}

/// A charge, created once per idempotency key. Fields added after the first journals were
/// written default when absent, so old journals still replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `pay_<32 hex digits>`.
    pub id: String,
    /// Where the payment is in its life.
    pub status: PaymentStatus,
    /// When its money is taken: at authorization, or on capture.
    #[serde(default)]
    pub capture_method: CaptureMethod,
    /// The amount asked for (and authorized), in minor units (cents), at least 1.
    pub amount_minor: i64,
    /// The amount taken: 0 until captured, all of it on an automatic success, the captured
    /// part after a partial capture.
    #[serde(default)]
    pub amount_captured: i64,
    /// ISO 4217 code, three upper-case letters.
    pub currency: String,
    /// The merchant's reference, e.g. an order id.
    pub reference: String,
    /// The key the payment was created with.
    pub idempotency_key: String,
    /// Set when `status` is `failed`.
    pub failure_reason: Option<FailureReason>,
    /// Set when `status` is `canceled`.
    #[serde(default)]
    pub cancellation_reason: Option<CancellationReason>,
    /// What the buyer must do, only while `requires_action`.
    #[serde(default)]
    pub next_action: Option<NextAction>,
    /// When the payment was created.
    pub created_at: DateTime<Utc>,
    /// Refunds against this payment, oldest first.
    pub refunds: Vec<Refund>,
    /// Disputes against this payment, oldest first.
    #[serde(default)]
    pub disputes: Vec<Dispute>,
}

impl Payment {
    /// What is still the merchant's to give back: captured, less refunded and disputed.
    pub fn refundable(&self) -> i64 {
        let refunded = self.refunds.iter().map(|r| r.amount_minor);
        let disputed = self.disputes.iter().map(|d| d.amount_minor);
        refunded
            .chain(disputed)
            .fold(self.amount_captured, i64::saturating_sub)
    }
}

/// Money given back against a succeeded payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// `re_<32 hex digits>`.
    pub id: String,
    /// The payment refunded.
    pub payment_id: String,
    /// Amount in minor units, at least 1.
    pub amount_minor: i64,
    /// Always `succeeded`.
    pub status: RefundStatus,
    /// When the refund was created.
    pub created_at: DateTime<Utc>,
}

/// What a dispute is about, as Stripe names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeReason {
    /// The buyer says they did not make the payment.
    Fraudulent,
    /// The buyer was charged twice.
    Duplicate,
    /// The goods never arrived.
    ProductNotReceived,
    /// The goods were not as described.
    ProductUnacceptable,
    /// A refund was promised but not given.
    CreditNotProcessed,
    /// The buyer does not recognise the payment.
    Unrecognized,
    /// Any other reason.
    #[default]
    General,
}

/// Where a dispute stands; the simulator opens them and never decides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeStatus {
    /// Opened; the money is taken back from the merchant meanwhile.
    NeedsResponse,
}

/// A buyer's bank taking money back from a captured payment (a chargeback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    /// `dp_<32 hex digits>`.
    pub id: String,
    /// The payment disputed.
    pub payment_id: String,
    /// Amount taken back, in minor units, at least 1.
    pub amount_minor: i64,
    /// Why.
    pub reason: DisputeReason,
    /// Always `needs_response`.
    pub status: DisputeStatus,
    /// When the dispute was opened.
    pub created_at: DateTime<Utc>,
}

/// A fresh payment id.
pub fn new_payment_id() -> String {
    format!("{PAYMENT_ID_PREFIX}{}", Uuid::new_v4().simple())
}

/// A fresh refund id.
pub fn new_refund_id() -> String {
    format!("{REFUND_ID_PREFIX}{}", Uuid::new_v4().simple())
}

/// A fresh dispute id.
pub fn new_dispute_id() -> String {
    format!("{DISPUTE_ID_PREFIX}{}", Uuid::new_v4().simple())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn request(amount_minor: i64, currency: &str, reference: &str) -> PaymentRequest {
        PaymentRequest {
            amount_minor,
            currency: currency.to_owned(),
            reference: reference.to_owned(),
            capture_method: CaptureMethod::Automatic,
        }
    }

    #[test]
    fn a_plain_request_is_valid() {
        assert_eq!(request(1990, "BRL", "ord_1").validate(), Ok(()));
    }

    #[test]
    fn each_broken_rule_names_its_field() {
        let field = |r: PaymentRequest| r.validate().unwrap_err().field;
        assert_eq!(field(request(0, "BRL", "o")), "amount_minor");
        assert_eq!(field(request(1, "brl", "o")), "currency");
        assert_eq!(field(request(1, "BRLX", "o")), "currency");
        assert_eq!(field(request(1, "BRL", "")), "reference");
        let refund = RefundRequest {
            amount_minor: Some(0),
        };
        assert_eq!(refund.validate().unwrap_err().field, "amount_minor");
        let capture = CaptureRequest {
            amount_minor: Some(0),
        };
        assert_eq!(capture.validate().unwrap_err().field, "amount_minor");
        let dispute = DisputeRequest {
            amount_minor: Some(-1),
            ..DisputeRequest::default()
        };
        assert_eq!(dispute.validate().unwrap_err().field, "amount_minor");
    }

    #[test]
    fn an_absent_capture_method_is_automatic_and_manual_is_spelled_out() {
        let body = r#"{"amount_minor": 1, "currency": "BRL", "reference": "o"}"#;
        let plain: PaymentRequest = serde_json::from_str(body).unwrap();
        assert_eq!(plain.capture_method, CaptureMethod::Automatic);
        let body = r#"{"amount_minor": 1, "currency": "BRL", "reference": "o", "capture_method": "manual"}"#;
        let manual: PaymentRequest = serde_json::from_str(body).unwrap();
        assert_eq!(manual.capture_method, CaptureMethod::Manual);
        let body = r#"{"amount_minor": 1, "currency": "BRL", "reference": "o", "capture_method": "later"}"#;
        let error = serde_json::from_str::<PaymentRequest>(body).unwrap_err();
        assert!(error.to_string().contains("later"), "{error}");
    }

    #[test]
    fn a_payment_journaled_before_captures_existed_still_reads() {
        let old = r#"{"id": "pay_1", "status": "succeeded", "amount_minor": 5,
            "currency": "BRL", "reference": "o", "idempotency_key": "k",
            "failure_reason": null, "created_at": "2026-01-01T00:00:00Z", "refunds": []}"#;
        let payment: Payment = serde_json::from_str(old).unwrap();
        assert_eq!(payment.capture_method, CaptureMethod::Automatic);
        assert_eq!((payment.amount_captured, payment.disputes.len()), (0, 0));
    }

    #[test]
    fn an_action_names_one_of_three_outcomes() {
        let request: ActionRequest = serde_json::from_str(r#"{"outcome": "abandoned"}"#).unwrap();
        assert_eq!(request.outcome, ActionOutcome::Abandoned);
        assert!(serde_json::from_str::<ActionRequest>(r#"{"outcome": "maybe"}"#).is_err());
        assert!(serde_json::from_str::<ActionRequest>("{}").is_err());
    }

    #[test]
    fn ids_carry_their_prefix_and_a_simple_uuid() {
        let id = new_payment_id();
        assert!(id.starts_with("pay_") && id.len() == 36, "{id}");
        assert!(new_refund_id().starts_with("re_"));
        let dispute = new_dispute_id();
        assert!(
            dispute.starts_with("dp_") && dispute.len() == 35,
            "{dispute}"
        );
    }
}
