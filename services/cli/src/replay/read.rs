//! Reading the stream up to a known last sequence with an ordered
//! consumer. A broker that is slow to answer (a consumer created late, a
//! pull that fails, a restart) does not end the replay: the read resumes
//! from the message after the last one handed on, a few times, with a
//! growing pause, before it gives up and names the failure.

use crate::CliError;
use anyhow::Context;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::stream::Stream;
use backon::BackoffBuilder;
use futures::StreamExt;
use std::time::Duration;

/// Resumptions after failed reads before the replay gives up.
const RESUMPTIONS: usize = 6;

/// Reads the stream with an ordered consumer from `deliver_policy` up to
/// sequence `last`, handing each message's sequence, event position
/// (`Soldonce-Position`) and payload to `each`, once each; redriven dead
/// letters are passed over.
pub async fn read(
    stream: &Stream,
    deliver_policy: DeliverPolicy,
    last: u64,
    mut each: impl FnMut(u64, Option<i64>, &[u8]),
) -> Result<(), CliError> {
    let mut pauses = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(RESUMPTIONS)
        .build();
    let mut from = deliver_policy;
    loop {
        let mut handed = None;
        let failure = match read_once(stream, from, last, &mut each, &mut handed).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let Some(pause) = pauses.next() else {
            return Err(failure
                .context(format!(
                    "reading the stream failed {} times",
                    RESUMPTIONS + 1
                ))
                .into());
        };
        if let Some(seq) = handed {
            from = DeliverPolicy::ByStartSequence {
                start_sequence: seq + 1,
            };
        }
        eprintln!(
            "replay: reading the stream failed ({failure:#}); reading on{} in {pause:?}",
            handed.map_or(String::new(), |s| format!(" after sequence {s}"))
        );
        tokio::time::sleep(pause).await;
    }
}

/// One ordered consumer's read; `handed` is the last sequence given to `each`.
async fn read_once(
    stream: &Stream,
    deliver_policy: DeliverPolicy,
    last: u64,
    each: &mut impl FnMut(u64, Option<i64>, &[u8]),
    handed: &mut Option<u64>,
) -> anyhow::Result<()> {
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await
        .context("creating an ordered consumer")?;
    let mut messages = consumer.messages().await.context("reading the stream")?;
    while let Some(message) = messages.next().await {
        let message = message.context("reading the stream")?;
        let seq = message
            .info()
            .map_err(|e| anyhow::anyhow!("a message without its stream sequence: {e}"))?
            .stream_sequence;
        // A redrive is a copy of a message for one consumer, not an event.
        if !events::names::is_redrive(&message.subject) {
            let position = message
                .headers
                .as_ref()
                .and_then(|h| h.get(bus::POSITION_HEADER))
                .and_then(|v| v.as_str().parse().ok());
            each(seq, position, &message.payload);
        }
        *handed = Some(seq);
        if seq >= last {
            return Ok(());
        }
    }
    anyhow::bail!("the stream ended before sequence {last}")
}
