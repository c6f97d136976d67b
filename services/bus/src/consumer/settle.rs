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
    /// Whether it may be a second copy of an event already handled: worth
    /// looking for in the inbox before the handler's work ([`may_be_a_copy`]).
    pub(super) suspect: bool,
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

/// How long after its event was recorded a first delivery must have been
/// published to be looked for in the inbox before it is handled.
const REPUBLISHED_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// Whether a message may carry an event this consumer has handled already:
/// a redelivery, or an event published well after it was recorded (a
/// stream repair, a redrive, a relay catching up on a backlog). A fresh
/// event delivered for the first time cannot be a second copy unless it
/// was published twice under two ids, which nothing does: the relay and
/// the repair publish an event under its own id, and the stream refuses
/// an id twice within its duplicate window. For those, the look-up before
/// the handler's work would be a round trip that finds nothing; the inbox
/// row written in the effect's own transaction stays the exact guard.
pub(super) fn may_be_a_copy(
    delivered: i64,
    recorded: chrono::DateTime<chrono::Utc>,
    published: chrono::DateTime<chrono::Utc>,
) -> bool {
    delivered > 1 || published - recorded > REPUBLISHED_AFTER
}
