//! The PSP's resources as they appear on the wire: payments, refunds and the requests that
//! create them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Longest `reference` accepted, in characters.
pub const MAX_REFERENCE_CHARS: usize = 255;
/// What every payment id starts with.
pub const PAYMENT_ID_PREFIX: &str = "pay_";
/// What every refund id starts with.
pub const REFUND_ID_PREFIX: &str = "re_";

/// Whether a charge went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Not decided yet (decided by `processing_rate`); settles to `succeeded` or `failed`
    /// after `processing_ms`.
    Processing,
    /// The money was taken.
    Succeeded,
    /// The charge was refused; nothing was taken.
    Failed,
}

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The issuer said no (decided by `decline_rate`).
    CardDeclined,
}

/// A refund's outcome; the simulator only ever succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// The money went back.
    Succeeded,
}

/// A charge, created once per idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `pay_<32 hex digits>`.
    pub id: String,
    /// The outcome: final at creation, or `processing` until it settles.
    pub status: PaymentStatus,
    /// Amount in minor units (cents), at least 1.
    pub amount_minor: i64,
    /// ISO 4217 code, three upper-case letters.
    pub currency: String,
    /// The merchant's reference, e.g. an order id.
    pub reference: String,
    /// The key the payment was created with.
    pub idempotency_key: String,
    /// Set when `status` is `failed`.
    pub failure_reason: Option<FailureReason>,
    /// When the payment was created.
    pub created_at: DateTime<Utc>,
    /// Refunds against this payment, oldest first.
    pub refunds: Vec<Refund>,
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

/// Body of `POST /v1/payments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {
    /// Amount in minor units, at least 1.
    pub amount_minor: i64,
    /// ISO 4217 code, three upper-case letters.
    pub currency: String,
    /// The merchant's reference, 1 to 255 characters.
    pub reference: String,
}

/// Body of `POST /v1/payments/{id}/refunds`; an empty body refunds everything left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// Amount in minor units; absent means everything not yet refunded.
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

/// A request that parsed but breaks a rule; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct InvalidRequest {
    /// The JSON field name.
    pub field: &'static str,
    /// What it must be.
    pub rule: &'static str,
}

impl PaymentRequest {
    /// Checks amount, currency and reference.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        if self.amount_minor < 1 {
            return Err(invalid("amount_minor", "must be at least 1"));
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(invalid(
                "currency",
                "must be three upper-case letters, e.g. BRL",
            ));
        }
        let chars = self.reference.chars().count();
        if chars == 0 || chars > MAX_REFERENCE_CHARS {
            return Err(invalid("reference", "must be 1 to 255 characters"));
        }
        Ok(())
    }
}

impl RefundRequest {
    /// Checks the amount, if one was given.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        match self.amount_minor {
            Some(amount) if amount < 1 => Err(invalid("amount_minor", "must be at least 1")),
            _ => Ok(()),
        }
    }
}

fn invalid(field: &'static str, rule: &'static str) -> InvalidRequest {
    InvalidRequest { field, rule }
}

/// A fresh payment id.
pub fn new_payment_id() -> String {
    format!("{PAYMENT_ID_PREFIX}{}", Uuid::new_v4().simple())
}

/// A fresh refund id.
pub fn new_refund_id() -> String {
    format!("{REFUND_ID_PREFIX}{}", Uuid::new_v4().simple())
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
    }

    #[test]
    fn ids_carry_their_prefix_and_a_simple_uuid() {
        let id = new_payment_id();
        assert!(id.starts_with("pay_") && id.len() == 36, "{id}");
        assert!(new_refund_id().starts_with("re_"));
    }
}
