//! The books' timers: settling payments that started as `processing`, and expiring
//! authorizations not captured in time. A background timer that, when each job falls due,
//! asks the books to do it, whether or not anyone is asking about the payment. If the books
//! cannot be written then, it tries again a little later.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How long to wait before trying again to settle a payment the books could not record.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What the timer does to a payment when it falls due.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Job {
    /// Settle a `processing` payment as rolled.
    Settle(String),
    /// Cancel a `requires_capture` payment as `expired`, if it still is.
    Expire(String),
}

/// What became of one attempt to do a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Settled now, or nothing to settle (already settled, or unknown).
    Done,
    /// The books could not record it; try again later.
    Retry,
}

/// Does one job.
pub(crate) type SettleFn = Box<dyn Fn(&Job) -> Settled + Send>;

/// A job, and when.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Due {
    at: Instant,
    job: Job,
}

/// Where payments are put to be settled later.
#[derive(Debug, Clone)]
pub(crate) struct SettlementQueue {
    sender: mpsc::UnboundedSender<Due>,
}

impl SettlementQueue {
    /// A queue, and its receiving end for a [`Settler`].
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<Due>) {
        let (sender, incoming) = mpsc::unbounded_channel();
        (Self { sender }, incoming)
    }

    /// Does `job` once `after` has passed.
    pub(crate) fn schedule(&self, job: Job, after: Duration) {
        let due = Due {
            at: Instant::now() + after,
            job,
        };
        if self.sender.send(due).is_err() {
            tracing::warn!("the settlement timer has stopped; the job is done after a restart");
        }
    }
}

/// Owns the timer until the application stops; payments still processing then stay so in
/// the books (and, when they are journaled, settle after the next start).
pub(crate) struct Settler {
    incoming: mpsc::UnboundedReceiver<Due>,
    waiting: BinaryHeap<Reverse<Due>>,
    settle: SettleFn,
    stop: watch::Receiver<bool>,
}

impl Settler {
    /// A timer settling what arrives on `incoming` by calling `settle`.
    pub(crate) fn new(
        incoming: mpsc::UnboundedReceiver<Due>,
        stop: watch::Receiver<bool>,
        settle: SettleFn,
    ) -> Self {
        Self {
            incoming,
            waiting: BinaryHeap::new(),
            settle,
            stop,
        }
    }

    /// Runs until `stop` turns true (or its sender, or every queue, goes away).
    pub(crate) async fn run(mut self) {
        let mut stop = self.stop.clone();
        loop {
            let next = self.waiting.peek().map(|Reverse(due)| due.at);
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => break,
                () = sleep_until(next), if next.is_some() => self.settle_due(),
                due = self.incoming.recv() => match due {
                    Some(due) => self.waiting.push(Reverse(due)),
                    None => break,
                },
            }
        }
    }

    fn settle_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse(due)) = self.waiting.peek() {
            if due.at > now {
                break;
            }
            let Some(Reverse(due)) = self.waiting.pop() else {
                break;
            };
            if (self.settle)(&due.job) == Settled::Retry {
                self.waiting.push(Reverse(Due {
                    at: now + RETRY_PAUSE,
                    job: due.job,
                }));
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn payments_settle_in_due_order_and_a_failed_attempt_is_retried() {
        let settled = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(1));
        let settle: SettleFn = Box::new({
            let settled = Arc::clone(&settled);
            move |job| {
                let (Job::Settle(id) | Job::Expire(id)) = job;
                let mut failures = failures.lock().unwrap();
                if id == "pay_b" && *failures > 0 {
                    *failures -= 1;
                    return Settled::Retry;
                }
                settled.lock().unwrap().push(id.to_owned());
                Settled::Done
            }
        });
        let (stop_sender, stop) = watch::channel(false);
        let (queue, incoming) = SettlementQueue::channel();
        let settler = Settler::new(incoming, stop, settle);
        queue.schedule(Job::Settle("pay_a".to_owned()), Duration::from_millis(300));
        queue.schedule(Job::Settle("pay_b".to_owned()), Duration::from_millis(100));
        queue.schedule(Job::Expire("pay_c".to_owned()), Duration::from_millis(200));
        let running = tokio::spawn(settler.run());

        // The clock is paused: these sleeps move virtual time, they wait for nothing.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(*settled.lock().unwrap(), ["pay_c"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*settled.lock().unwrap(), ["pay_c", "pay_a", "pay_b"]);

        stop_sender.send_replace(true);
        running.await.unwrap();
    }
}
