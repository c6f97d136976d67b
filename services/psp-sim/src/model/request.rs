//! The bodies of the requests that create or change payments, and the rules a body must keep
//! beyond its shape (each broken rule names its field).

use serde::{Deserialize, Serialize};

use super::{CaptureMethod, DisputeReason, MAX_REFERENCE_CHARS};

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
    /// When the money is taken; absent means `automatic`.
    #[serde(default)]
    pub capture_method: CaptureMethod,
}

/// Body of `POST /v1/payments/{id}/refunds`; an empty body refunds everything left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// Amount in minor units; absent means everything not yet refunded.
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

/// Body of `POST /v1/payments/{id}/capture`; an empty body captures everything authorized.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    /// Amount to capture; absent means all of it. The rest is released.
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

/// Body of `POST /v1/payments/{id}/cancel`: nothing (`{}` at most).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {}

/// How the simulated buyer ends a 3-D Secure step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionOutcome {
    /// Authenticated: the payment is authorized.
    Succeeded,
    /// Failed to authenticate: `failed`, `authentication_failed`.
    Failed,
    /// Walked away: `canceled`, `abandoned`.
    Abandoned,
}

/// Body of `POST /v1/payments/{id}/action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// What the buyer did.
    pub outcome: ActionOutcome,
}

/// Body of `POST /admin/payments/{id}/dispute`; empty disputes everything left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisputeRequest {
    /// Amount disputed; absent means all that is captured and not refunded or disputed.
    #[serde(default)]
    pub amount_minor: Option<i64>,
    /// Why; absent means `general`.
    #[serde(default)]
    pub reason: DisputeReason,
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
        optional_amount(self.amount_minor)
    }
}

impl CaptureRequest {
    /// Checks the amount, if one was given.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        optional_amount(self.amount_minor)
    }
}

impl DisputeRequest {
    /// Checks the amount, if one was given.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        optional_amount(self.amount_minor)
    }
}

fn optional_amount(amount_minor: Option<i64>) -> Result<(), InvalidRequest> {
    match amount_minor {
        Some(amount) if amount < 1 => Err(invalid("amount_minor", "must be at least 1")),
        _ => Ok(()),
    }
}

fn invalid(field: &'static str, rule: &'static str) -> InvalidRequest {
    InvalidRequest { field, rule }
}
