//! Redriving dead letters: each selected letter's message, exactly as it
//! was delivered, is published again on `soldonce.redrive.<consumer>.…`,
//! which only the consumer that gave up on it reads
//! ([`crate::consumer::ensure_consumer`]), so no other consumer sees it
//! again and readers of events (replay, `events tail`) pass over it.
//!
//! The consumer then handles it as any delivery: its inbox drops it if
//! that event's effect is already committed, and it is dead-lettered again
//! (a new letter) if it still cannot be handled. Republishing on the
//! original subject would reach every consumer of that subject (a letter
//! that is not even JSON would become a dead letter of each), and with the
//! original `Nats-Msg-Id` JetStream would drop it inside its duplicate
//! window.
//!
//! Safe to run twice and beside the consumers: the letters are locked in
//! one transaction while their messages are published (every PubAck
//! awaited) and stamped `redriven_at` when it commits, so a second run
//! finds nothing left to send; each message's id is `redrive-<letter id>`,
//! so a run that died between the publish and the commit publishes the
//! same message again, which JetStream drops inside its duplicate window
//! and the consumer's inbox beyond it.

use crate::STREAM;
use anyhow::Context as _;
use async_nats::jetstream::{self, message::PublishMessage};
use serde::Serialize;
use sqlx::PgPool;
use store::dead_letters::{Letter, Selection};

/// The header that names the dead letter a redriven message came from.
pub const REDRIVE_HEADER: &str = "Soldonce-Redrive";

/// One letter sent again.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Redriven {
    pub id: i64,
    pub consumer: String,
    /// The subject it was published on.
    pub subject: String,
    /// Its sequence in the stream (0 in a dry run).
    pub stream_seq: u64,
}

/// A letter that cannot be redriven, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Refused {
    pub id: i64,
    pub why: String,
}

/// What a redrive did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Report {
    pub dry_run: bool,
    pub redriven: Vec<Redriven>,
    pub refused: Vec<Refused>,
}

/// Says which of the selected letters a redrive would send, and which it
/// could not; sends nothing (no NATS needed).
pub async fn plan(pool: &PgPool, selection: &Selection) -> anyhow::Result<Report> {
    let mut tx = pool.begin().await.context("opening a transaction")?;
    let letters = store::dead_letters::lock_outstanding(&mut tx, selection)
        .await
        .context("reading the dead letters")?;
    tx.rollback().await.context("ending the dry run")?;
    let (sendable, refused) = sort(&letters);
    Ok(Report {
        dry_run: true,
        redriven: sendable
            .iter()
            .map(|(l, subject)| redriven(l, subject, 0))
            .collect(),
        refused,
    })
}

/// Redrives the selected letters not yet redriven.
pub async fn redrive(
    pool: &PgPool,
    js: &jetstream::Context,
    selection: &Selection,
) -> anyhow::Result<Report> {
    let mut tx = pool.begin().await.context("opening a transaction")?;
    let letters = store::dead_letters::lock_outstanding(&mut tx, selection)
        .await
        .context("reading the dead letters")?;
    let (sendable, refused) = sort(&letters);
    let sequences = publish(js, &sendable).await?;
    let ids: Vec<i64> = sendable.iter().map(|(l, _)| l.id).collect();
    store::dead_letters::mark_redriven(&mut tx, &ids)
        .await
        .context("stamping the letters redriven")?;
    tx.commit().await.context("committing the redrive")?;
    metrics::counter!("soldonce_dead_letters_redriven_total").increment(ids.len() as u64);
    Ok(Report {
        dry_run: false,
        redriven: sendable
            .iter()
            .zip(sequences)
            .map(|((l, subject), seq)| redriven(l, subject, seq))
            .collect(),
        refused,
    })
}

/// The letters that can be redriven, each with its redrive subject, and
/// those that cannot (a consumer or subject no redrive subject can carry).
fn sort(letters: &[Letter]) -> (Vec<(&Letter, String)>, Vec<Refused>) {
    let mut sendable = Vec::with_capacity(letters.len());
    let mut refused = Vec::new();
    for letter in letters {
        match events::names::redrive_subject(&letter.consumer, &letter.subject) {
            Some(subject) => sendable.push((letter, subject)),
            None => refused.push(Refused {
                id: letter.id,
                why: format!(
                    "consumer {:?} or subject {:?} cannot carry a redrive",
                    letter.consumer, letter.subject
                ),
            }),
        }
    }
    (sendable, refused)
}

fn redriven(letter: &Letter, subject: &str, stream_seq: u64) -> Redriven {
    Redriven {
        id: letter.id,
        consumer: letter.consumer.clone(),
        subject: subject.to_owned(),
        stream_seq,
    }
}

/// Publishes every message, then awaits every PubAck; their sequences.
async fn publish(
    js: &jetstream::Context,
    sendable: &[(&Letter, String)],
) -> anyhow::Result<Vec<u64>> {
    let mut acks = Vec::with_capacity(sendable.len());
    for (letter, subject) in sendable {
        let message = PublishMessage::build()
            .payload(letter.payload.clone().into())
            .message_id(format!("redrive-{}", letter.id))
            .header(REDRIVE_HEADER, letter.id.to_string().as_str());
        let ack = js
            .send_publish(subject.clone(), message)
            .await
            .with_context(|| format!("publishing dead letter {} to {STREAM}", letter.id))?;
        acks.push(std::future::IntoFuture::into_future(ack));
    }
    let mut sequences = Vec::with_capacity(acks.len());
    for (ack, (letter, _)) in futures::future::join_all(acks)
        .await
        .into_iter()
        .zip(sendable)
    {
        let ack = ack.with_context(|| format!("awaiting the ack of dead letter {}", letter.id))?;
        sequences.push(ack.sequence);
    }
    Ok(sequences)
}
