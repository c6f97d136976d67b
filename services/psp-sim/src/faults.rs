//! Fault knobs: what the simulator does wrong on purpose, and the switch that holds the ones in
//! force (set from `PSP_FAULTS` at start, replaced through `PUT /admin/faults`).

use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// Longest injected latency or webhook delay accepted, in milliseconds (ten minutes).
pub const MAX_DELAY_MS: u64 = 600_000;
/// Longest authorization accepted, in milliseconds (seven days, as Stripe holds a card's).
pub const MAX_AUTHORIZATION_TTL_MS: u64 = 7 * 24 * 60 * 60 * 1000;
/// Most copies of one webhook accepted.
pub const MAX_WEBHOOK_DUPLICATES: u32 = 100;

/// The faults in force. Every field is optional in JSON; unknown fields are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Share of new payments declined (`failed`, `card_declined`), 0..=1.
    pub decline_rate: f64,
    /// Delay before every `/v1` request is handled.
    pub latency_ms: u64,
    /// The next N payment/refund POSTs answer 503 and do nothing; re-armed on every replacement.
    pub fail_first: u32,
    /// Share of payment/refund POSTs whose effect happens but whose reply never arrives, 0..=1.
    pub lose_reply_rate: f64,
    /// Delay before the first attempt of every webhook.
    pub webhook_delay_ms: u64,
    /// Copies sent of every webhook, all with the same `webhook-id` (1 = no duplicates).
    pub webhook_duplicates: u32,
    /// Hold webhooks briefly and deliver each batch newest first.
    pub webhook_reorder: bool,
    /// Share of webhooks never sent, 0..=1.
    pub drop_webhook_rate: f64,
    /// Share of new payments that start as `processing` and settle later, 0..=1.
    pub processing_rate: f64,
    /// How long a `processing` payment stays so before it settles.
    pub processing_ms: u64,
    /// Share of new payments that start as `requires_action` (a 3-D Secure step the buyer
    /// completes through `/action`), 0..=1; the decline and processing rolls skip them.
    pub action_required_rate: f64,
    /// How long a `requires_capture` payment stays so before its authorization lapses
    /// (`canceled`, `expired`); 0 = never.
    pub authorization_ttl_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            decline_rate: 0.0,
            latency_ms: 0,
            fail_first: 0,
            lose_reply_rate: 0.0,
            webhook_delay_ms: 0,
            webhook_duplicates: 1,
            webhook_reorder: false,
            drop_webhook_rate: 0.0,
            processing_rate: 0.0,
            processing_ms: 1000,
            action_required_rate: 0.0,
            authorization_ttl_ms: 0,
        }
    }
}

/// Why a fault configuration was refused; the message starts with the offending field.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FaultsError {
    /// Not a JSON object of known fields with the right types.
    #[error("{0}")]
    Malformed(String),
    /// A field is out of its range.
    #[error("{field}: {rule}, got {value}")]
    OutOfRange {
        /// The JSON field name.
        field: &'static str,
        /// What the value must be.
        rule: &'static str,
        /// The value given.
        value: String,
    },
}

impl Faults {
    /// Parses and validates a JSON object such as `{"decline_rate": 0.5}`.
    pub fn from_json(text: &str) -> Result<Self, FaultsError> {
        let faults: Self = serde_json::from_str(text)
            .map_err(|error| FaultsError::Malformed(explain(text, &error)))?;
        faults.validate()?;
        Ok(faults)
    }

    /// Checks every field against its range.
    pub fn validate(&self) -> Result<(), FaultsError> {
        for (field, rate) in [
            ("decline_rate", self.decline_rate),
            ("lose_reply_rate", self.lose_reply_rate),
            ("drop_webhook_rate", self.drop_webhook_rate),
            ("processing_rate", self.processing_rate),
            ("action_required_rate", self.action_required_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(out_of_range(field, "must be between 0 and 1", rate));
            }
        }
        for (field, ms) in [
            ("latency_ms", self.latency_ms),
            ("webhook_delay_ms", self.webhook_delay_ms),
            ("processing_ms", self.processing_ms),
        ] {
            if ms > MAX_DELAY_MS {
                return Err(out_of_range(field, "must be at most 600000", ms));
            }
        }
        if self.authorization_ttl_ms > MAX_AUTHORIZATION_TTL_MS {
            return Err(out_of_range(
                "authorization_ttl_ms",
                "must be at most 604800000 (7 days)",
                self.authorization_ttl_ms,
            ));
        }
        if !(1..=MAX_WEBHOOK_DUPLICATES).contains(&self.webhook_duplicates) {
            return Err(out_of_range(
                "webhook_duplicates",
                "must be between 1 and 100",
                self.webhook_duplicates,
            ));
        }
        Ok(())
    }
}

fn out_of_range(field: &'static str, rule: &'static str, value: impl ToString) -> FaultsError {
    FaultsError::OutOfRange {
        field,
        rule,
        value: value.to_string(),
    }
}

/// serde's type errors do not say which field they are about; find it by trying the fields one
/// at a time (every field has a default, so a one-field object fails only on that field).
fn explain(text: &str, error: &serde_json::Error) -> String {
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(text) {
        for (name, value) in fields {
            let alone = serde_json::Value::Object([(name.clone(), value)].into_iter().collect());
            if let Err(field_error) = serde_json::from_value::<Faults>(alone) {
                let message = field_error.to_string();
                return if message.starts_with("unknown field") {
                    format!("{name}: unknown field")
                } else {
                    format!("{name}: {message}")
                };
            }
        }
    }
    error.to_string()
}

/// The faults in force plus how many injected failures remain; shared by handlers and webhooks.
#[derive(Debug)]
pub struct FaultSwitch {
    active: Mutex<Active>,
}

#[derive(Debug)]
struct Active {
    faults: Faults,
    failures_left: u32,
}

/// What a payment or refund POST may do, given `fail_first`.
#[derive(Debug)]
pub enum Admission {
    /// Go ahead under these faults.
    Admitted(Faults),
    /// Answer 503 and do nothing.
    InjectedFailure,
}

impl FaultSwitch {
    /// A switch with these faults in force.
    pub fn new(faults: Faults) -> Self {
        Self {
            active: Mutex::new(Active {
                failures_left: faults.fail_first,
                faults,
            }),
        }
    }

    /// A copy of the faults in force.
    pub fn current(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// Replaces every fault and re-arms `fail_first`.
    pub fn replace(&self, faults: Faults) {
        let mut active = self.lock();
        active.failures_left = faults.fail_first;
        active.faults = faults;
    }

    /// Consumes one injected failure if any remain, else admits the call.
    pub fn admit(&self) -> Admission {
        let mut active = self.lock();
        if active.failures_left > 0 {
            active.failures_left -= 1;
            Admission::InjectedFailure
        } else {
            Admission::Admitted(active.faults.clone())
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Active> {
        // The guarded data stays consistent even if a holder panicked: every write is one step.
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether an event with this probability happens this time.
pub fn roll(rate: f64) -> bool {
    rate > 0.0 && rand::random::<f64>() < rate
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_object_means_no_faults() {
        assert_eq!(Faults::from_json("{}").unwrap(), Faults::default());
        assert_eq!(Faults::default().webhook_duplicates, 1);
    }

    #[test]
    fn an_unknown_field_is_named() {
        let error = Faults::from_json(r#"{"decline_rate": 0.1, "explode": true}"#).unwrap_err();
        assert_eq!(error.to_string(), "explode: unknown field");
    }

    #[test]
    fn a_wrongly_typed_field_is_named() {
        let error = Faults::from_json(r#"{"latency_ms": "slow"}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("latency_ms: invalid type"),
            "{error}"
        );
    }

    #[test]
    fn a_rate_above_one_is_refused_naming_the_field() {
        let error = Faults::from_json(r#"{"drop_webhook_rate": 1.5}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "drop_webhook_rate: must be between 0 and 1, got 1.5"
        );
    }

    #[test]
    fn processing_knobs_are_checked_like_the_others() {
        assert_eq!(Faults::default().processing_ms, 1000);
        let error = Faults::from_json(r#"{"processing_rate": -0.5}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "processing_rate: must be between 0 and 1, got -0.5"
        );
        let error = Faults::from_json(r#"{"processing_ms": 600001}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "processing_ms: must be at most 600000, got 600001"
        );
        let faults = Faults::from_json(r#"{"processing_rate": 1, "processing_ms": 0}"#).unwrap();
        assert_eq!((faults.processing_rate, faults.processing_ms), (1.0, 0));
    }

    #[test]
    fn action_and_authorization_knobs_are_checked_like_the_others() {
        let defaults = Faults::default();
        assert_eq!(
            (defaults.action_required_rate, defaults.authorization_ttl_ms),
            (0.0, 0)
        );
        let error = Faults::from_json(r#"{"action_required_rate": 1.01}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "action_required_rate: must be between 0 and 1, got 1.01"
        );
        let error = Faults::from_json(r#"{"authorization_ttl_ms": 604800001}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "authorization_ttl_ms: must be at most 604800000 (7 days), got 604800001"
        );
        let error = Faults::from_json(r#"{"authorization_ttl_ms": -1}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("authorization_ttl_ms: "),
            "{error}"
        );
        let week = r#"{"action_required_rate": 1, "authorization_ttl_ms": 604800000}"#;
        let faults = Faults::from_json(week).unwrap();
        assert_eq!(faults.authorization_ttl_ms, MAX_AUTHORIZATION_TTL_MS);
    }

    #[test]
    fn zero_duplicates_are_refused() {
        let error = Faults::from_json(r#"{"webhook_duplicates": 0}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("webhook_duplicates:"),
            "{error}"
        );
    }

    #[test]
    fn fail_first_fails_exactly_n_calls_and_rearms_on_replace() {
        let switch = FaultSwitch::new(Faults {
            fail_first: 2,
            ..Faults::default()
        });
        assert!(matches!(switch.admit(), Admission::InjectedFailure));
        assert!(matches!(switch.admit(), Admission::InjectedFailure));
        assert!(matches!(switch.admit(), Admission::Admitted(_)));
        switch.replace(Faults {
            fail_first: 1,
            ..Faults::default()
        });
        assert!(matches!(switch.admit(), Admission::InjectedFailure));
        assert!(matches!(switch.admit(), Admission::Admitted(_)));
    }

    #[test]
    fn rates_of_zero_and_one_are_certain() {
        assert!((0..100).all(|_| !roll(0.0)));
        assert!((0..100).all(|_| roll(1.0)));
    }
}
