//! Publishing: each claimed row sent to JetStream with its event id as
//! `Nats-Msg-Id`, and every PubAck awaited; a row that can never be
//! published is set apart to be parked.

use super::lag::seconds_between;
use crate::poison::{self, Poison};
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use platform::otel::{Hop, Kind};
use platform::trace::TraceParent;
use std::future::IntoFuture;
use store::outbox::OutboxRow;

/// What publishing a batch came to; rows go by their index in the batch.
#[derive(Default)]
pub(super) struct Sent {
    /// The positions of the rows JetStream acknowledged.
    pub(super) published: Vec<i64>,
    /// The stream sequences of the new messages among them (not duplicates).
    pub(super) sequences: Vec<u64>,
    /// The rows that can never be published, with why.
    pub(super) parked: Vec<(usize, Poison)>,
    /// The first failure worth retrying; its row stays in the outbox.
    pub(super) failure: Option<anyhow::Error>,
    /// Each row's producer span, recorded when the batch is done (dropped).
    pub(super) hops: Vec<Option<Hop>>,
}

/// Publishes `rows` and awaits every ack.
pub(super) async fn publish(js: &jetstream::Context, rows: &[OutboxRow]) -> Sent {
    let mut sent = Sent::default();
    let pending = send(js, rows, &mut sent).await;
    await_acks(rows, pending, &mut sent).await;
    sent
}

/// Sends each row in turn and returns the acks to await, by row; stops at
/// a failure that is likely the connection's, leaving the rest for the retry.
async fn send(
    js: &jetstream::Context,
    rows: &[OutboxRow],
    sent: &mut Sent,
) -> Vec<(usize, <PublishAckFuture as IntoFuture>::IntoFuture)> {
    // 0 before the first connection: then only the client's own check applies.
    let max_payload = js.client().server_info().max_payload;
    let mut pending = Vec::with_capacity(rows.len());
    sent.hops.reserve(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let hop = producer_hop(row);
        let traceparent = hop
            .as_ref()
            .map(|h| (h.traceparent(), h.tracestate().map(str::to_owned)));
        sent.hops.push(hop);
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
    sent.published.reserve(acked.len());
    sent.sequences.reserve(acked.len());
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
