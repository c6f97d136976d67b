//! Repairing the stream from the authority.
//!
//! JetStream acknowledges a publish before it reaches disk (the server
//! syncs every `sync_interval`, 2 minutes by default), so a power loss can
//! take back messages it had acknowledged, after the relay deleted their
//! outbox rows. PostgreSQL's `events` still holds every one of them. A
//! repair lists the events that left the outbox since a point
//! ([`store::outbox::published_page`]), reads which of them the stream
//! holds (its messages' `Soldonce-Position` header, headers only, with an
//! ordered consumer), and republishes the rest in position order with their
//! own `Nats-Msg-Id`: inside the duplicate window JetStream drops a message
//! it still has, and consumers dedupe by event id beyond it.
//!
//! The database is read before the stream: an event that left the outbox
//! by then was acknowledged by then, so the stream holds it unless it was
//! lost. Nothing here runs SQL of its own; it must never delete from or
//! rewrite the stream.

use crate::{POSITION_HEADER, STREAM};
use anyhow::Context as _;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::{self, message::PublishMessage};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How far before a repair's starting point the stream is read: messages
/// are stamped by the broker's clock and events by the database's (and a
/// late commit can be published after younger events).
pub const CLOCK_MARGIN: Duration = Duration::from_secs(60);

/// Events listed, loaded and republished per round.
const PAGE: i64 = 5_000;

/// How long a scan waits for the next message before it gives up on the
/// stream (the scan stops at the last sequence it saw when it began).
const SCAN_IDLE: Duration = Duration::from_secs(30);

/// Where a repair or a comparison starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// Every event the stream still keeps (from its first message).
    All,
    /// Events from this position on.
    Position(i64),
    /// Events recorded at or after this time (database clock).
    Time(DateTime<Utc>),
}

/// What a comparison or a repair found and did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    /// The first position compared.
    pub from_position: i64,
    /// Events from there on that the stream must hold (they left the outbox).
    pub expected: u64,
    /// Messages of the stream read.
    pub scanned: u64,
    /// Expected events the stream lacks.
    pub missing: u64,
    /// The first of them.
    pub first_missing: Option<i64>,
    /// Missing events republished (and acknowledged).
    pub republished: u64,
    pub seconds: f64,
}

/// Finds the events since `since` that the stream lacks, and republishes
/// them unless `dry_run`.
pub async fn repair(
    pool: &PgPool,
    js: &jetstream::Context,
    since: Since,
    dry_run: bool,
) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut stream = js
        .get_stream(STREAM)
        .await
        .context("opening the SOLDONCE stream")?;
    let state = stream
        .info()
        .await
        .context("reading the stream's state")?
        .state
        .clone();
    let margin = chrono::TimeDelta::from_std(CLOCK_MARGIN).unwrap_or_default();
    // A stream whose limits dropped old messages holds only what came after its first one.
    let kept_from =
        (state.first_sequence > 1 && state.messages > 0).then(|| state.first_timestamp + margin);
    let (from_position, scan_from) = match since {
        Since::All => (1, None),
        Since::Position(p) => (
            p.max(1),
            store::stream_copy::recorded_at(pool, p)
                .await?
                .map(|t| t - margin),
        ),
        Since::Time(t) => (
            store::stream_copy::first_position_at(pool, t).await?,
            Some(t - margin),
        ),
    };
    let from_position = match kept_from {
        Some(t) => from_position.max(store::stream_copy::first_position_at(pool, t).await?),
        None => from_position,
    };
    let mut report = Report {
        from_position,
        ..Report::default()
    };
    // The database first (see the module's doc), then the stream, read up
    // to its last sequence as it is after the database was read: every
    // event that had left the outbox by then was acknowledged by then.
    let expected = expected_since(pool, from_position).await?;
    report.expected = expected.len() as u64;
    let present = if expected.is_empty() {
        HashSet::new()
    } else {
        let last = stream
            .info()
            .await
            .context("reading the stream's state")?
            .state
            .last_sequence;
        let (present, scanned) = scan(pool, &mut stream, scan_from, last).await?;
        report.scanned = scanned;
        present
    };
    let missing: Vec<i64> = expected
        .into_iter()
        .filter(|p| !present.contains(p))
        .collect();
    report.missing = missing.len() as u64;
    report.first_missing = missing.first().copied();
    if !dry_run {
        report.republished = republish_missing(pool, js, &missing).await?;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Republishes the events at `missing` positions, a page at a time;
/// returns how many were acknowledged.
async fn republish_missing(
    pool: &PgPool,
    js: &jetstream::Context,
    missing: &[i64],
) -> anyhow::Result<u64> {
    let Some(first) = missing.first() else {
        return Ok(0);
    };
    // Said before it is done: a process killed while republishing leaves
    // this line as the only sign that it had begun.
    tracing::warn!(
        missing = missing.len(),
        first_missing = first,
        "the stream lacks events that left the outbox; republishing them from the database"
    );
    let mut republished = 0;
    for page in missing.chunks(PAGE as usize) {
        let messages = store::stream_copy::messages(pool, page).await?;
        republished += republish(js, &messages).await?;
    }
    Ok(republished)
}

/// Positions from `from` on of the events that left the outbox, in order.
async fn expected_since(pool: &PgPool, from: i64) -> anyhow::Result<Vec<i64>> {
    let mut expected = Vec::new();
    let mut after = from - 1;
    loop {
        let page = store::outbox::published_page(pool, from, after, PAGE).await?;
        let Some(&last) = page.last() else { break };
        after = last;
        let full = page.len() as i64 == PAGE;
        expected.extend(page);
        if !full {
            break;
        }
    }
    Ok(expected)
}

/// The positions the stream's messages carry, from `from` (broker time;
/// `None`: the first message) up to sequence `last`, and how many messages
/// were read. Headers only: the payloads stay on the server. A message
/// sent before the relay stamped positions is known by its `Nats-Msg-Id`.
async fn scan(
    pool: &PgPool,
    stream: &mut jetstream::stream::Stream,
    from: Option<DateTime<Utc>>,
    last: u64,
) -> anyhow::Result<(HashSet<i64>, u64)> {
    let mut present = HashSet::new();
    let mut unstamped: Vec<Uuid> = Vec::new();
    let mut scanned = 0;
    if last == 0 {
        return Ok((present, 0));
    }
    let deliver_policy = match from {
        Some(start_time) => DeliverPolicy::ByStartTime { start_time },
        None => DeliverPolicy::All,
    };
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy,
            headers_only: true,
            ..Default::default()
        })
        .await
        .context("creating an ordered consumer to read the stream")?;
    let mut messages = consumer.messages().await.context("reading the stream")?;
    loop {
        let next = match tokio::time::timeout(SCAN_IDLE, messages.next()).await {
            // Nothing at or after the start time: the stream ended before it.
            Err(_) if scanned == 0 => break,
            Err(_) => anyhow::bail!("the stream stopped answering after {scanned} messages"),
            Ok(None) => break,
            Ok(Some(m)) => m.context("reading the stream")?,
        };
        scanned += 1;
        let seq = next.info().map(|i| i.stream_sequence).unwrap_or(last);
        let headers = next.headers.as_ref();
        let stamped = headers
            .and_then(|h| h.get(POSITION_HEADER))
            .and_then(|v| v.as_str().parse::<i64>().ok());
        match stamped {
            Some(p) => {
                present.insert(p);
            }
            None => {
                if let Some(id) = headers
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .and_then(|v| Uuid::parse_str(v.as_str()).ok())
                {
                    unstamped.push(id);
                }
            }
        }
        if unstamped.len() >= PAGE as usize {
            present.extend(store::stream_copy::positions_of(pool, &unstamped).await?);
            unstamped.clear();
        }
        if seq >= last {
            break;
        }
    }
    if !unstamped.is_empty() {
        present.extend(store::stream_copy::positions_of(pool, &unstamped).await?);
    }
    Ok((present, scanned))
}

/// Publishes `messages` (awaiting every ack together) and returns how many
/// the stream acknowledged as new.
async fn republish(
    js: &jetstream::Context,
    messages: &[store::stream_copy::EventMessage],
) -> anyhow::Result<u64> {
    let mut acks = Vec::with_capacity(messages.len());
    for m in messages {
        let id = m.event_id.to_string();
        let mut publish = PublishMessage::build()
            .payload(m.payload.clone().into())
            .message_id(&id)
            .header(POSITION_HEADER, m.position.to_string().as_str());
        if let Some(tp) = m
            .traceparent
            .as_deref()
            .filter(|tp| !tp.is_empty() && tp.bytes().all(|b| b.is_ascii_graphic()))
        {
            publish = publish.header("traceparent", tp);
            if let Some(state) = platform::trace::tracestate(m.tracestate.as_deref()) {
                publish = publish.header("tracestate", state.as_str());
            }
        }
        let ack = js
            .send_publish(m.subject.clone(), publish)
            .await
            .with_context(|| {
                format!(
                    "republishing event {} (position {})",
                    m.event_id, m.position
                )
            })?;
        acks.push(std::future::IntoFuture::into_future(ack));
    }
    let mut new = 0;
    for (ack, m) in futures::future::join_all(acks)
        .await
        .into_iter()
        .zip(messages)
    {
        let ack = ack.with_context(|| {
            format!(
                "awaiting the ack of republished event {} (position {})",
                m.event_id, m.position
            )
        })?;
        if !ack.duplicate {
            new += 1;
        }
    }
    metrics::counter!("soldonce_stream_republished_total").increment(new);
    Ok(new)
}
