//! Webhooks: the events the simulator announces, the queue handlers put them on, and the
//! background dispatcher that applies the webhook faults and delivers them signed.

mod deliver;
mod dispatch;

use std::fmt;

use axum::body::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::model::{Dispute, Payment, PaymentStatus, Refund};

pub use deliver::{BuildClientError, Deliverer};
pub use dispatch::Dispatcher;

/// The kinds of event announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// A payment awaits the buyer's 3-D Secure step.
    #[serde(rename = "payment.requires_action")]
    PaymentRequiresAction,
    /// A payment was authorized and awaits its capture.
    #[serde(rename = "payment.requires_capture")]
    PaymentRequiresCapture,
    /// A payment succeeded: its money was taken.
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    /// A payment was canceled (requested, abandoned or expired).
    #[serde(rename = "payment.canceled")]
    PaymentCanceled,
    /// A payment failed (declined, or authentication failed).
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    /// A refund was created.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A dispute was opened against a payment.
    #[serde(rename = "dispute.created")]
    DisputeCreated,
}

impl EventType {
    /// The wire name, e.g. `payment.succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::PaymentRequiresAction => "payment.requires_action",
            EventType::PaymentRequiresCapture => "payment.requires_capture",
            EventType::PaymentSucceeded => "payment.succeeded",
            EventType::PaymentCanceled => "payment.canceled",
            EventType::PaymentFailed => "payment.failed",
            EventType::RefundSucceeded => "refund.succeeded",
            EventType::DisputeCreated => "dispute.created",
        }
    }

    /// The event announcing a payment's new status; `None` for `processing`.
    pub fn for_payment(status: PaymentStatus) -> Option<Self> {
        match status {
            PaymentStatus::Processing => None,
            PaymentStatus::RequiresAction => Some(EventType::PaymentRequiresAction),
            PaymentStatus::RequiresCapture => Some(EventType::PaymentRequiresCapture),
            PaymentStatus::Succeeded => Some(EventType::PaymentSucceeded),
            PaymentStatus::Canceled => Some(EventType::PaymentCanceled),
            PaymentStatus::Failed => Some(EventType::PaymentFailed),
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A webhook body: `{"type", "timestamp", "data"}`, where data is a payment, a refund or a
/// dispute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookPayload<T> {
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When it happened (RFC 3339).
    pub timestamp: DateTime<Utc>,
    /// The payment, refund or dispute as it was then.
    pub data: T,
}

/// The trace a webhook continues: the span of the call that caused it,
/// and the caller's `tracestate`.
pub type Trace = (platform::trace::TraceParent, Option<String>);

/// One event to deliver: its id and body are fixed, so every retry and duplicate is identical.
#[derive(Debug, Clone)]
pub struct WebhookEvent {
    /// `msg_<32 hex digits>`, sent as `webhook-id`.
    pub id: String,
    /// What happened.
    pub event_type: EventType,
    /// The JSON body.
    pub body: Bytes,
    /// The trace it continues, when there is one: the span of the call
    /// that created the payment (each delivery attempt is a client span of
    /// its own under it).
    pub traceparent: Option<platform::trace::TraceParent>,
    /// The W3C `tracestate` that came with it, sent on with each attempt.
    pub tracestate: Option<String>,
    /// The merchant's reference (the order), for the logs.
    pub reference: Option<String>,
}

impl WebhookEvent {
    fn new<T: Serialize>(event_type: EventType, data: &T) -> Result<Self, serde_json::Error> {
        let payload = WebhookPayload {
            event_type,
            timestamp: Utc::now(),
            data,
        };
        Ok(Self {
            id: format!("msg_{}", Uuid::new_v4().simple()),
            event_type,
            body: Bytes::from(serde_json::to_vec(&payload)?),
            traceparent: None,
            tracestate: None,
            reference: None,
        })
    }
}

/// Where handlers put events; a no-op when no webhook URL is configured.
#[derive(Debug, Clone)]
pub struct WebhookQueue {
    sender: Option<mpsc::UnboundedSender<WebhookEvent>>,
}

impl WebhookQueue {
    /// A queue that discards everything (no `PSP_WEBHOOK_URL`).
    pub fn disabled() -> Self {
        Self { sender: None }
    }

    /// A queue feeding a dispatcher.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<WebhookEvent>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (
            Self {
                sender: Some(sender),
            },
            receiver,
        )
    }

    /// Announces a payment's new status: at creation, or on any later change; `processing`
    /// is announced by nothing. `trace` is the one the change was asked under, if known.
    pub fn payment_changed(&self, payment: &Payment, trace: Option<Trace>) {
        if let Some(event_type) = EventType::for_payment(payment.status) {
            self.publish(event_type, payment, trace, Some(&payment.reference));
        }
    }

    /// Announces a new refund.
    pub fn refund_created(&self, refund: &Refund) {
        self.publish(EventType::RefundSucceeded, refund, None, None);
    }

    /// Announces a new dispute.
    pub fn dispute_created(&self, dispute: &Dispute) {
        self.publish(EventType::DisputeCreated, dispute, None, None);
    }

    fn publish<T: Serialize>(
        &self,
        event_type: EventType,
        data: &T,
        trace: Option<Trace>,
        reference: Option<&str>,
    ) {
        let Some(sender) = &self.sender else { return };
        match WebhookEvent::new(event_type, data) {
            Ok(mut event) => {
                (event.traceparent, event.tracestate) =
                    trace.map_or((None, None), |(t, s)| (Some(t), s));
                event.reference = reference.map(str::to_owned);
                tracing::debug!(webhook_id = %event.id, %event_type, "webhook queued");
                if sender.send(event).is_err() {
                    tracing::warn!(%event_type, "webhook dispatcher has stopped; event not sent");
                }
            }
            Err(error) => tracing::error!(%error, %event_type, "could not encode webhook"),
        }
    }
}
