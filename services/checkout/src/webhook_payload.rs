//! The PSP's callback bodies as checkout reads them, and what each one
//! reports: a payment fact, a dispute, or a status its type may not carry.

use serde::Deserialize;
use store::payments::PaymentFact;

/// A callback's body: its type and the object it is about.
#[derive(Deserialize)]
pub(crate) struct Callback {
    #[serde(rename = "type")]
    pub(crate) event_type: String,
    pub(crate) data: CallbackData,
}

/// A payment's `next_action` (3-D Secure): where the buyer completes it.
#[derive(Deserialize)]
struct NextAction {
    url: String,
}

/// The object a callback is about: a payment, a refund or a dispute.
#[derive(Deserialize)]
pub(crate) struct CallbackData {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) status: Option<String>,
    #[serde(default)]
    pub(crate) amount_minor: Option<i64>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    pub(crate) reference: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    failure_reason: Option<String>,
    /// Set on a canceled authorization: why (`requested`, `abandoned`, `expired`).
    #[serde(default)]
    cancellation_reason: Option<String>,
    /// Set while the payment `requires_action`: where the buyer must go.
    #[serde(default)]
    next_action: Option<NextAction>,
    /// Set on refunds and disputes: the payment refunded or disputed.
    #[serde(default)]
    pub(crate) payment_id: Option<String>,
    /// Set on disputes: why, in the PSP's words.
    #[serde(default)]
    reason: Option<String>,
}

impl CallbackData {
    /// The dispute a `dispute.created` callback reports, if it is complete.
    pub(crate) fn dispute_report(&self) -> Option<store::disputes::DisputeReport> {
        Some(store::disputes::DisputeReport {
            dispute_id: self.id.chars().take(255).collect(),
            payment_id: self.payment_id.as_deref()?.chars().take(255).collect(),
            amount_minor: self.amount_minor.filter(|a| *a >= 0)?,
            reason: self
                .reason
                .as_deref()
                .unwrap_or("general")
                .chars()
                .take(64)
                .collect(),
        })
    }

    /// The payment fact a `payment.*` callback reports, if it is complete.
    pub(crate) fn payment_fact(&self) -> Option<PaymentFact> {
        Some(PaymentFact {
            payment_id: self.id.chars().take(255).collect(),
            order_id: store::payments::own_order(
                self.reference.as_deref(),
                self.idempotency_key.as_deref(),
            ),
            status: domain::PspStatus::parse(self.status.as_deref()?),
            amount_minor: self.amount_minor?,
            currency: self.currency.as_deref()?.chars().take(16).collect(),
            failure_reason: self
                .failure_reason
                .as_deref()
                .map(|r| r.chars().take(200).collect())
                .or_else(|| {
                    self.cancellation_reason
                        .as_deref()
                        .map(|r| format!("canceled ({})", r.chars().take(64).collect::<String>()))
                }),
            abandoned: self.cancellation_reason.as_deref() == Some("abandoned"),
            next_action_url: self.next_action.as_ref().map(|a| a.url.clone()),
        })
    }
}

/// The statuses each event type may carry. A type not listed keeps
/// today's reading (`None`): the table only refuses what it knows to be
/// contradictory, such as a `payment.refunded` saying `succeeded` (which a
/// `payment.*` reading would otherwise take for a success).
fn statuses_for(event_type: &str) -> Option<&'static [&'static str]> {
    Some(match event_type {
        "payment.succeeded" => &["succeeded"],
        "payment.failed" => &["failed"],
        "payment.processing" => &["processing"],
        "payment.requires_action" => &["requires_action"],
        "payment.requires_capture" => &["requires_capture"],
        "payment.canceled" => &["canceled"],
        "payment.refunded" => &["refunded"],
        "refund.succeeded" => &["succeeded"],
        "refund.failed" => &["failed"],
        _ => return None,
    })
}

/// Whether a callback's status is one its type may carry (a callback with
/// no status, or of a type not in the table, is read as before).
pub(crate) fn consistent(callback: &Callback) -> bool {
    match (
        statuses_for(&callback.event_type),
        callback.data.status.as_deref(),
    ) {
        (Some(allowed), Some(status)) => allowed.contains(&status),
        _ => true,
    }
}
