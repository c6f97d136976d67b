//! Whether payments are already recorded, asked for many webhooks at once.
//!
//! Under load nearly every webhook reports a payment the worker's batch has
//! recorded, or is about to: the webhook looks whether it is recorded,
//! and looks again a few times before it takes the order's lock itself
//! (`webhooks.rs`). Asked one by one, each look was a statement and a
//! transaction of its own, with the pool's round trips around it: 1.17 per
//! order at saturation, more than half of all transactions
//! (`scripts/bench/statements.sh CLOSED=1`). Here one task answers the
//! looks: it takes every look waiting, asks for all their payments in one
//! statement, answers each, and takes the looks that arrived meanwhile.
//! Nothing waits for a batch to fill: a look that finds the task idle is
//! asked for at once, alone.

use crate::error::ApiError;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// Most payments asked for in one statement.
const MOST_PER_STATEMENT: usize = 512;

/// A look's answer: whether its payment is recorded, or why it could not be told.
type Answer = Result<bool, ApiError>;

struct Look {
    payment_id: String,
    answer: oneshot::Sender<Answer>,
}

/// The handle webhooks ask through; the task ends when the last handle is dropped.
pub(crate) struct KnownPayments {
    looks: mpsc::Sender<Look>,
}

impl KnownPayments {
    /// Starts the task that answers looks, on `pool`.
    pub(crate) fn start(pool: PgPool) -> Self {
        metrics::counter!("soldonce_webhook_looks_total").increment(0);
        metrics::counter!("soldonce_webhook_look_statements_total").increment(0);
        let (looks, waiting) = mpsc::channel(MOST_PER_STATEMENT * 4);
        tokio::spawn(answer_looks(pool, waiting));
        KnownPayments { looks }
    }

    /// Whether `payment_id` is recorded.
    pub(crate) async fn is_known(&self, payment_id: &str) -> Answer {
        let (answer, answered) = oneshot::channel();
        let look = Look {
            payment_id: payment_id.to_owned(),
            answer,
        };
        let gone = || ApiError::Unavailable("the payment look-up has stopped".into());
        self.looks.send(look).await.map_err(|_| gone())?;
        metrics::counter!("soldonce_webhook_looks_total").increment(1);
        answered.await.map_err(|_| gone())?
    }
}

async fn answer_looks(pool: PgPool, mut waiting: mpsc::Receiver<Look>) {
    let mut looks = Vec::with_capacity(MOST_PER_STATEMENT);
    while waiting.recv_many(&mut looks, MOST_PER_STATEMENT).await > 0 {
        let ids: Vec<&str> = looks.iter().map(|l| l.payment_id.as_str()).collect();
        let known = store::payments::known_among(&pool, &ids).await;
        metrics::counter!("soldonce_webhook_look_statements_total").increment(1);
        for look in looks.drain(..) {
            let answer = match &known {
                Ok(known) => Ok(known.contains(&look.payment_id)),
                Err(e) => Err(ApiError::from(e)),
            };
            // A webhook whose client went away no longer waits: nothing to answer.
            let _ = look.answer.send(answer);
        }
    }
}
