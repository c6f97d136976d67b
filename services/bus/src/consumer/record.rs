//! Recording: a batch prepared at once, each prepared message recorded by
//! the consumer's recorders in one transaction with its inbox rows.

use super::handler::{ConsumerSpec, Delivery, HandleError, Handler};
use super::settle::{settle, InHand};
use events::Inbox;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Where one message of a batch is.
enum Step<P> {
    /// Still being prepared.
    Preparing,
    /// Prepared, held back behind an earlier message of its subject.
    Prepared(P),
    /// With a recorder, not yet committed.
    Recording,
    /// Committed, or failed.
    Settled,
}

/// The prepared messages that may go to a recorder now: those that no
/// earlier message of the same subject (its order) in the batch is ahead of,
/// still being prepared or recorded. Taken in batch order.
fn take_ready<P>(subjects: &[&str], steps: &mut [Step<P>]) -> Vec<(usize, P)> {
    let mut held: HashSet<&str> = HashSet::new();
    let mut ready = Vec::new();
    for (i, subject) in subjects.iter().enumerate() {
        match &steps[i] {
            Step::Preparing | Step::Recording => {
                held.insert(subject);
            }
            Step::Prepared(_) if held.contains(subject) => {}
            Step::Prepared(_) => {
                if let Step::Prepared(p) = std::mem::replace(&mut steps[i], Step::Recording) {
                    ready.push((i, p));
                }
                held.insert(subject);
            }
            Step::Settled => {}
        }
    }
    ready
}

/// A prepared message on its way to a recorder, and where its outcome goes.
pub(super) struct Job<P> {
    delivery: Arc<Delivery>,
    prepared: P,
    done: oneshot::Sender<Result<(), HandleError>>,
}

/// Prepares every delivery at once and hands each prepared one to the
/// recorders (see the module's documentation), settling each message once
/// it is committed or its preparation has failed; marks it in `settled`.
pub(super) async fn handle<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    to_record: &mpsc::Sender<Job<H::Prepared>>,
    hand: &[InHand],
    settled: &[AtomicBool],
    started: Instant,
) {
    let settler = Settler {
        inbox,
        spec,
        hand,
        settled,
        started,
    };
    let deliveries: Vec<&Delivery> = hand.iter().map(|h| h.delivery.as_ref()).collect();
    let subjects: Vec<&str> = hand
        .iter()
        .map(|h| h.delivery.event.subject.as_str())
        .collect();
    let mut steps: Vec<Step<H::Prepared>> = hand.iter().map(|_| Step::Preparing).collect();
    let mut prepared = std::pin::pin!(handler.prepare_all(&spec.name, &deliveries));
    let mut preparing = true;
    let mut recording = FuturesUnordered::new();
    loop {
        tokio::select! {
            next = prepared.next(), if preparing => {
                preparing = take_prepared(&settler, &mut prepared, next, &mut steps).await;
            }
            Some((i, outcome)) = recording.next(), if !recording.is_empty() => {
                steps[i] = Step::Settled;
                settler.finish(i, outcome).await;
            }
            else => break,
        }
        for (i, outcome) in send_ready(&settler, to_record, &subjects, &mut steps).await {
            recording.push(outcome.map(move |o| {
                (
                    i,
                    o.unwrap_or_else(|_| {
                        Err(HandleError::Transient(anyhow::anyhow!(
                            "its recorder ended"
                        )))
                    }),
                )
            }));
        }
    }
    settle_unprepared(&settler, &steps).await;
}

/// What settling one message of a batch needs.
struct Settler<'a, I> {
    inbox: &'a I,
    spec: &'a ConsumerSpec,
    hand: &'a [InHand],
    settled: &'a [AtomicBool],
    started: Instant,
}

impl<I: Inbox> Settler<'_, I> {
    /// Settles message `i` by its outcome, marks it settled and records how
    /// long the batch had been in hand.
    async fn finish(&self, i: usize, outcome: Result<(), HandleError>) {
        self.settled[i].store(true, Ordering::Relaxed);
        metrics::histogram!("soldonce_consumer_handle_seconds", "consumer" => self.spec.name.clone())
            .record(self.started.elapsed().as_secs_f64());
        settle(self.inbox, self.spec, &self.hand[i], outcome).await
    }
}

/// Takes what `prepare_all` yielded (`next`) and all else it has ready
/// now: each message prepared, or settled if its preparation failed.
/// `false` once the stream has ended.
async fn take_prepared<I: Inbox, P, S>(
    settler: &Settler<'_, I>,
    prepared: &mut Pin<&mut S>,
    next: Option<(usize, Result<P, HandleError>)>,
    steps: &mut [Step<P>],
) -> bool
where
    S: Stream<Item = (usize, Result<P, HandleError>)>,
{
    // Everything prepared by now goes together.
    let mut next = Some(next);
    while let Some(item) = next.take() {
        match item {
            Some((i, result)) if matches!(steps.get(i), Some(Step::Preparing)) => match result {
                Ok(p) => steps[i] = Step::Prepared(p),
                Err(e) => {
                    steps[i] = Step::Settled;
                    settler.finish(i, Err(e)).await;
                }
            },
            Some((i, _)) => {
                tracing::error!(consumer = %settler.spec.name, index = i, messages = settler.hand.len(), "prepare_all yielded an index twice or out of range");
            }
            None => return false,
        }
        next = prepared.next().now_or_never();
    }
    true
}

/// Hands each message that may go now ([`take_ready`]) to the recorders;
/// one that cannot go (the consumer is stopping) is settled at once.
/// Returns where each handed message's outcome will come.
async fn send_ready<I: Inbox, P>(
    settler: &Settler<'_, I>,
    to_record: &mpsc::Sender<Job<P>>,
    subjects: &[&str],
    steps: &mut [Step<P>],
) -> Vec<(usize, oneshot::Receiver<Result<(), HandleError>>)> {
    let mut sent = Vec::new();
    for (i, p) in take_ready(subjects, steps) {
        let (done, outcome) = oneshot::channel();
        let job = Job {
            delivery: settler.hand[i].delivery.clone(),
            prepared: p,
            done,
        };
        if to_record.send(job).await.is_err() {
            steps[i] = Step::Settled;
            settler
                .finish(
                    i,
                    Err(HandleError::Transient(anyhow::anyhow!(
                        "the consumer is stopping"
                    ))),
                )
                .await;
            continue;
        }
        sent.push((i, outcome));
    }
    sent
}

/// Settles, to be retried later, each message `prepare_all` never yielded.
async fn settle_unprepared<I: Inbox, P>(settler: &Settler<'_, I>, steps: &[Step<P>]) {
    // A handler's bug, not the messages': retry what it never prepared later.
    for (i, step) in steps.iter().enumerate() {
        if matches!(step, Step::Preparing) {
            tracing::error!(consumer = %settler.spec.name, event_id = %settler.hand[i].delivery.event.id, "prepare_all never yielded this message");
            settler
                .finish(
                    i,
                    Err(HandleError::Transient(anyhow::anyhow!(
                        "prepare_all never yielded it"
                    ))),
                )
                .await;
        }
    }
}

/// One recorder: takes every prepared message waiting (up to the batch
/// size), records them in one transaction, or each alone if that fails, and
/// answers each; until the queue closes.
pub(super) async fn recorder<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    queue: &tokio::sync::Mutex<mpsc::Receiver<Job<H::Prepared>>>,
) {
    let mut jobs = Vec::with_capacity(spec.batching.batch_size.max(1));
    loop {
        jobs.clear();
        if queue
            .lock()
            .await
            .recv_many(&mut jobs, spec.batching.batch_size.max(1))
            .await
            == 0
        {
            return;
        }
        metrics::histogram!("soldonce_consumer_transaction_size", "consumer" => spec.name.clone())
            .record(jobs.len() as f64);
        let items: Vec<(&Delivery, &H::Prepared)> = jobs
            .iter()
            .map(|j| (j.delivery.as_ref(), &j.prepared))
            .collect();
        let began = Instant::now();
        let outcome = record(inbox, spec, handler, &items).await;
        metrics::histogram!("soldonce_consumer_transaction_seconds", "consumer" => spec.name.clone())
            .record(began.elapsed().as_secs_f64());
        let outcomes = match outcome {
            Ok(()) => items.iter().map(|_| Ok(())).collect(),
            Err(e) if items.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::warn!(error = %e, consumer = %spec.name, size = items.len(), "a transaction failed; recording its messages one by one");
                metrics::counter!("soldonce_consumer_batches_split_total", "consumer" => spec.name.clone())
                    .increment(1);
                let mut outcomes = Vec::with_capacity(items.len());
                for item in &items {
                    outcomes.push(record(inbox, spec, handler, std::slice::from_ref(item)).await);
                }
                outcomes
            }
        };
        drop(items);
        for (job, outcome) in jobs.drain(..).zip(outcomes) {
            let _ = job.done.send(outcome);
        }
    }
}

/// One transaction: the inbox rows, the fresh deliveries' effects, the commit.
async fn record<H: Handler>(
    inbox: &H::Inbox,
    spec: &ConsumerSpec,
    handler: &H,
    items: &[(&Delivery, &H::Prepared)],
) -> Result<(), HandleError> {
    // A recorder's transaction may hold messages of several batches, so the
    // same event twice (e.g. published again under another message id): the
    // first one's effect is the only one.
    let mut once = HashSet::new();
    let ids: Vec<Uuid> = items
        .iter()
        .map(|(d, _)| d.event.id)
        .filter(|id| once.insert(*id))
        .collect();
    let (mut tx, fresh) = inbox
        .begin(&spec.name, &ids)
        .await
        .map_err(|e| HandleError::Transient(anyhow::anyhow!("writing the inbox rows: {e}")))?;
    let mut fresh: HashSet<Uuid> = ids
        .iter()
        .zip(fresh)
        .filter_map(|(id, fresh)| fresh.then_some(*id))
        .collect();
    let fresh: Vec<(&Delivery, &H::Prepared)> = items
        .iter()
        .filter(|(d, _)| fresh.remove(&d.event.id))
        .copied()
        .collect();
    if fresh.len() < items.len() {
        metrics::counter!("soldonce_consumer_duplicates_total", "consumer" => spec.name.clone())
            .increment((items.len() - fresh.len()) as u64);
    }
    if fresh.is_empty() {
        // Every one was recorded before, perhaps by a commit the synchronous
        // standbys never got: the inbox's commit confirms it before the acks.
        return inbox
            .commit(tx)
            .await
            .map_err(|e| HandleError::Transient(anyhow::anyhow!("committing: {e}")));
    }
    let recorded = handler.record(&mut tx, &fresh).await?;
    inbox
        .commit(tx)
        .await
        .map_err(|e| HandleError::Transient(anyhow::anyhow!("committing: {e}")))?;
    handler.committed(recorded);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{take_ready, Step};

    fn taken(ready: Vec<(usize, char)>) -> String {
        ready.into_iter().map(|(_, p)| p).collect()
    }

    #[test]
    fn what_is_prepared_goes_on_but_never_ahead_of_an_earlier_message_of_its_order() {
        // a1 is still being prepared; b and c are ready; a2 (same order as a1) is ready.
        let subjects = ["a", "b", "a", "c"];
        let mut steps = vec![
            Step::Preparing,
            Step::Prepared('b'),
            Step::Prepared('2'),
            Step::Prepared('c'),
        ];
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "bc");
        assert_eq!(
            taken(take_ready(&subjects, &mut steps)),
            "",
            "nothing new is ready"
        );
        steps[0] = Step::Prepared('1');
        assert_eq!(
            taken(take_ready(&subjects, &mut steps)),
            "1",
            "a2 waits until a1 is committed"
        );
        steps[0] = Step::Settled;
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "2");
        assert!(steps
            .iter()
            .all(|s| matches!(s, Step::Recording | Step::Settled)));
    }

    #[test]
    fn a_message_held_back_behind_its_order_also_holds_back_the_next_one() {
        let subjects = ["a", "a", "a"];
        let mut steps = vec![Step::Settled, Step::Preparing, Step::Prepared('3')];
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "");
        steps[1] = Step::Prepared('2');
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "2");
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "");
        steps[1] = Step::Settled;
        assert_eq!(taken(take_ready(&subjects, &mut steps)), "3");
    }
}
