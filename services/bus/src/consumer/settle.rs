//! Settling: acking a message once recorded, retrying it later (`Nak`
//! with backoff), or dead-lettering it.

use super::handler::{ConsumerSpec, Delivery, HandleError};
use async_nats::jetstream::{self, AckKind};
use events::{DeadLetter, Inbox};
use platform::otel::Hop;
use std::sync::Arc;

/// A message in a batch, with its delivery once the envelope is valid.
pub(super) struct InHand {
    pub(super) message: jetstream::Message,
    pub(super) seq: u64,
    pub(super) delivery: Arc<Delivery>,
    /// The consumer span (recorded when the message leaves the hand); the
    /// delivery's `traceparent` names it, so what the handler writes continues it.
    pub(super) hop: Option<std::sync::Mutex<Hop>>,
}

/// Acks, retries or dead-letters one message by its outcome.
pub(super) async fn settle<I: Inbox>(
    inbox: &I,
    spec: &ConsumerSpec,
    h: &InHand,
    outcome: Result<(), HandleError>,
) {
    let (message, seq, delivered) = (&h.message, h.seq, h.delivery.delivered);
    if let (Err(e), Some(hop)) = (&outcome, &h.hop) {
        if let Ok(mut hop) = hop.lock() {
            hop.fail(e);
        }
    }
    match outcome {
        Ok(()) => {
            metrics::counter!("soldonce_consumer_handled_total", "consumer" => spec.name.clone())
                .increment(1);
            let _ = message.ack().await;
        }
        Err(HandleError::Permanent(reason)) => {
            dead_letter(inbox, spec, message, seq, &reason).await
        }
        Err(HandleError::Transient(e)) if delivered >= spec.max_deliver => {
            let reason = format!("max deliveries reached: {e:#}");
            dead_letter(inbox, spec, message, seq, &reason).await;
        }
        Err(HandleError::Transient(e)) => {
            tracing::warn!(error = %format!("{e:#}"), consumer = %spec.name, event_id = %h.delivery.event.id, trace_id = %h.delivery.trace_id(), delivered, "handler failed; will retry");
            let step = usize::try_from(delivered - 1).unwrap_or(0);
            let delay = spec.backoff.get(step).or(spec.backoff.last()).copied();
            let _ = message.ack_with(AckKind::Nak(delay)).await;
        }
    }
}

/// Acks a message whose event this consumer already handled.
pub(super) async fn duplicate(spec: &ConsumerSpec, message: &jetstream::Message) {
    metrics::counter!("soldonce_consumer_duplicates_total", "consumer" => spec.name.clone())
        .increment(1);
    let _ = message.ack().await;
}

/// Records a message that can never be handled and stops its redelivery.
pub(super) async fn dead_letter<I: Inbox>(
    inbox: &I,
    spec: &ConsumerSpec,
    message: &jetstream::Message,
    seq: u64,
    reason: &str,
) {
    tracing::error!(consumer = %spec.name, stream_seq = seq, reason, "dead-lettering a message");
    metrics::counter!("soldonce_dead_letters_total", "consumer" => spec.name.clone()).increment(1);
    let letter = DeadLetter {
        consumer: spec.name.clone(),
        stream_seq: seq,
        subject: message.subject.to_string(),
        payload: message.payload.to_vec(),
        reason: reason.to_owned(),
    };
    match inbox.dead_letter(&letter).await {
        Ok(_) => {
            let _ = message.ack_with(AckKind::Term).await;
        }
        // Not recorded: leave it for redelivery rather than lose it.
        Err(e) => {
            tracing::error!(error = %e, "could not record the dead letter; it will be redelivered")
        }
    }
}
