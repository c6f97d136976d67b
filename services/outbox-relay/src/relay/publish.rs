//! Publishing: each claimed event sent to JetStream with its event id as
//! `Nats-Msg-Id`, and every PubAck awaited; an event that can never be
//! published is set apart to be parked.
//!
//! One outbox row holds up to 32 of the events one statement appended, so
//! a batch can hold two events of one order (a payment's authorization and
//! the order's confirmation). They go out in rounds: the first event of
//! each order in the batch, then, once those are acknowledged, the second,
//! and so on, so a later event of an order never reaches the stream while
//! an earlier one failed (it is written back to the outbox instead, see
//! `settle`). A round's events are sent pipelined, a window of at most
//! [`in_flight`] before their acks are awaited: the lanes share one
//! JetStream context, which admits [`ACKS_ADMITTED`] unacknowledged
//! publishes and then makes the next one wait for an ack, which a batch
//! that awaits its acks only after sending would never see. The stream's
//! repair publishes on a context of its own.

use super::lag::seconds_between;
use crate::poison::{self, Poison};
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use platform::otel::{Hop, Kind};
use platform::trace::TraceParent;
use std::collections::HashMap;
use std::future::IntoFuture;
use store::outbox::OutboxRow;

/// How many unacknowledged publishes a JetStream context admits before
/// the next one waits for an ack (async-nats' default).
pub(super) const ACKS_ADMITTED: usize = 5_000;

/// The publishes each of `lanes` lanes sends before awaiting their acks:
/// together at most 4,000, under the shared context's [`ACKS_ADMITTED`],
/// and at most 1,000 each.
pub(super) fn in_flight(lanes: usize) -> usize {
    (ACKS_ADMITTED * 4 / 5 / lanes.max(1)).clamp(1, 1_000)
}

/// What publishing a batch came to; events go by their index in the batch.
pub(super) struct Sent {
    /// The positions of the events JetStream acknowledged.
    pub(super) published: Vec<i64>,
    /// The stream sequences of the new messages among them (not duplicates).
    pub(super) sequences: Vec<u64>,
    /// The events that can never be published, with why.
    pub(super) parked: Vec<(usize, Poison)>,
    /// The first failure worth retrying; its event, and every event not
    /// sent after it, stays in the outbox.
    pub(super) failure: Option<anyhow::Error>,
    /// Each event's producer span, recorded when the batch is done (dropped).
    pub(super) hops: Vec<Option<Hop>>,
}

/// Publishes `rows` (a batch's events, in position order) in rounds, each
/// order's events in turn, `window` at a time, awaiting every ack; stops
/// after the first window with a failure, leaving the rest for the retry.
pub(super) async fn publish(js: &jetstream::Context, rows: &[OutboxRow], window: usize) -> Sent {
    let mut sent = Sent {
        published: Vec::with_capacity(rows.len()),
        sequences: Vec::with_capacity(rows.len()),
        parked: Vec::new(),
        failure: None,
        hops: rows.iter().map(|_| None).collect(),
    };
    for round in rounds(rows) {
        for indexes in round.chunks(window.max(1)) {
            let pending = send(js, rows, indexes, &mut sent).await;
            await_acks(rows, pending, &mut sent).await;
            if sent.failure.is_some() {
                return sent;
            }
        }
    }
    sent
}

/// The batch's events by round: an event's round is how many events of its
/// order come before it in the batch. Each round keeps position order.
fn rounds(rows: &[OutboxRow]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<sqlx::types::Uuid, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let round = seen.entry(row.stream_id).or_default();
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(i);
        *round += 1;
    }
    rounds
}

/// Sends the events at `indexes` in turn and returns the acks to await, by
/// event; stops at a failure that is likely the connection's, leaving the
/// rest for the retry.
async fn send(
    js: &jetstream::Context,
    rows: &[OutboxRow],
    indexes: &[usize],
    sent: &mut Sent,
) -> Vec<(usize, <PublishAckFuture as IntoFuture>::IntoFuture)> {
    // 0 before the first connection: then only the client's own check applies.
    let max_payload = js.client().server_info().max_payload;
    let mut pending = Vec::with_capacity(indexes.len());
    for &i in indexes {
        let row = &rows[i];
        let hop = producer_hop(row);
        let traceparent = hop
            .as_ref()
            .map(|h| (h.traceparent(), h.tracestate().map(str::to_owned)));
        sent.hops[i] = hop;
        let message = match message(row, traceparent, max_payload) {
            Ok(m) => m,
            Err(p) => {
                sent.parked.push((i, p));
                continue;
            }
        };
        match js.send_publish(row.message.subject.clone(), message).await {
            Ok(ack) => pending.push((i, IntoFuture::into_future(ack))),
            Err(e) => match poison::classify(&e) {
                Some(p) => sent.parked.push((i, p)),
                None => {
                    // The connection is likely gone: leave the rest of the batch for the retry.
                    if let Some(hop) = sent.hops[i].as_mut() {
                        hop.fail(&e);
                    }
                    sent.failure = Some(
                        anyhow::Error::new(e)
                            .context(format!("publishing event {}", row.message.event_id)),
                    );
                    break;
                }
            },
        }
    }
    pending
}

/// The relay's producer span for `row`, when the row carries a valid
/// `traceparent` to continue.
fn producer_hop(row: &OutboxRow) -> Option<Hop> {
    row.message
        .traceparent
        .as_deref()
        .and_then(TraceParent::parse)
        .map(|parent| {
            let state = platform::trace::tracestate(row.message.tracestate.as_deref());
            let mut hop = Hop::start(
                Kind::Producer,
                format!("publish {}", row.message.subject),
                Some(parent),
            )
            .with_tracestate(state);
            hop.attribute("messaging.system", "nats");
            hop.attribute("messaging.destination.name", row.message.subject.clone());
            hop.attribute("messaging.message.id", row.message.event_id.to_string());
            hop
        })
}

/// Awaits the acks of the rows sent, noting each row published, parked or
/// failed.
async fn await_acks(
    rows: &[OutboxRow],
    pending: Vec<(usize, <PublishAckFuture as IntoFuture>::IntoFuture)>,
    sent: &mut Sent,
) {
    let lag = metrics::histogram!("soldonce_outbox_commit_to_puback_seconds");
    // The acks are awaited together (their timeouts run at once), so a
    // dead connection costs one timeout, not one per row.
    let (waiting, acks): (Vec<usize>, Vec<_>) = pending.into_iter().unzip();
    let acked = futures::future::join_all(acks).await;
    for (i, ack) in waiting.into_iter().zip(acked) {
        let row = &rows[i];
        match ack {
            Ok(ack) => {
                if ack.duplicate {
                    metrics::counter!("soldonce_outbox_duplicates_total").increment(1);
                } else {
                    sent.sequences.push(ack.sequence);
                }
                lag.record(seconds_between(row.created_at, chrono::Utc::now()));
                tracing::debug!(
                    event_id = %row.message.event_id,
                    order_id = %row.stream_id,
                    trace_id = row
                        .message
                        .traceparent
                        .as_deref()
                        .and_then(platform::trace::TraceParent::parse)
                        .map(|t| t.trace_id()),
                    subject = %row.message.subject,
                    "event published"
                );
                sent.published.push(row.message.position);
            }
            Err(e) => match poison::classify(&e) {
                Some(p) => sent.parked.push((i, p)),
                None => {
                    if let Some(hop) = sent.hops[i].as_mut() {
                        hop.fail(&e);
                    }
                    sent.failure.get_or_insert_with(|| {
                        anyhow::Error::new(e).context(format!(
                            "awaiting the ack of event {}",
                            row.message.event_id
                        ))
                    });
                }
            },
        }
    }
}

/// The message for `row`, or why it can never be published: an event
/// whose metadata cannot be read, a subject the stream does not take, or a
/// size over the server's `max_payload` (counted as the server does:
/// headers plus payload).
fn message(
    row: &OutboxRow,
    traceparent: Option<(TraceParent, Option<String>)>,
    max_payload: usize,
) -> Result<PublishMessage, Poison> {
    if !poison::publishable_subject(&row.message.subject) {
        return Err(Poison::new(
            poison::BAD_SUBJECT,
            format!(
                "{:?} is not a subject under {}",
                row.message.subject,
                bus::SUBJECTS
            ),
        ));
    }
    let id = row.message.event_id.to_string();
    let position = row.message.position.to_string();
    let mut headers: Vec<(&str, &str)> = vec![
        ("Nats-Msg-Id", id.as_str()),
        (bus::POSITION_HEADER, position.as_str()),
    ];
    // The relay's own span (a parsed traceparent: printable ASCII, never the stored text).
    let (traceparent, tracestate) = match traceparent {
        Some((t, s)) => (Some(t.to_string()), s),
        None => (None, None),
    };
    if let Some(state) = &tracestate {
        headers.push(("tracestate", state.as_str()));
    }
    match (&traceparent, &row.message.traceparent) {
        (Some(tp), _) => headers.push(("traceparent", tp.as_str())),
        (None, Some(_)) => {
            tracing::warn!(event_id = %row.message.event_id, "dropping a malformed traceparent header")
        }
        (None, None) => {}
    }
    let size = poison::wire_size(&headers, row.message.payload.len());
    if max_payload > 0 && size > max_payload {
        return Err(Poison::new(
            poison::TOO_LARGE,
            format!("the message is {size} bytes (headers and payload); the server's max_payload is {max_payload}"),
        ));
    }
    // `message_id` adds a header; `headers()` would replace them all.
    let mut publish = PublishMessage::build()
        .payload(row.message.payload.clone().into())
        .message_id(&id);
    for (name, value) in &headers[1..] {
        publish = publish.header(*name, *value);
    }
    Ok(publish)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::types::Uuid;

    #[test]
    fn an_orders_second_event_in_a_batch_waits_for_a_round_after_its_first() {
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let rows: Vec<OutboxRow> = [(a, 1), (b, 2), (a, 3), (c, 4), (a, 5), (b, 6)]
            .into_iter()
            .map(|(stream, position)| super::super::test_event(1, stream, position))
            .collect();
        assert_eq!(rounds(&rows), vec![vec![0, 1, 3], vec![2, 5], vec![4]]);
    }

    #[test]
    fn the_lanes_windows_together_stay_under_what_the_context_admits() {
        for lanes in 1..=16 {
            let window = in_flight(lanes);
            assert!((1..=1_000).contains(&window));
            assert!(window * lanes < ACKS_ADMITTED, "{lanes} lanes of {window}");
        }
        assert_eq!(in_flight(2), 1_000);
        assert_eq!(in_flight(16), 250);
    }
}
