//! The two workloads: a sellout, where every buyer is released at once to
//! race for one unit, and a closed loop, where each connection sends its
//! next order as soon as the last one is answered, for a fixed time.

use super::target::{Outcome, Target};
use crate::CliError;
use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How the answers fell.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Answers {
    pub accepted: u64,
    pub sold_out: u64,
    pub failed: u64,
    /// The first failure's cause, to tell a timeout from a refusal.
    pub first_failure: Option<String>,
}

impl Answers {
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Accepted => self.accepted += 1,
            Outcome::SoldOut => self.sold_out += 1,
            Outcome::Failed(why) => {
                self.failed += 1;
                self.first_failure.get_or_insert(why);
            }
        }
    }

    fn merge(&mut self, other: Answers) {
        self.accepted += other.accepted;
        self.sold_out += other.sold_out;
        self.failed += other.failed;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }
}

/// `buyers` buyers, each in a task of its own and released together, try
/// to buy one unit of `sku`.
pub async fn sellout(target: &Target, sku: &str, buyers: usize) -> Answers {
    let start = Arc::new(tokio::sync::Barrier::new(buyers));
    let tasks: Vec<_> = (0..buyers)
        .map(|_| {
            let (buyer, start, sku) = (target.buyer(), start.clone(), sku.to_owned());
            tokio::spawn(async move {
                start.wait().await;
                buyer.buy(&sku).await
            })
        })
        .collect();
    let mut answers = Answers::default();
    for joined in futures::future::join_all(tasks).await {
        answers.count(joined.unwrap_or_else(|e| Outcome::Failed(format!("buyer task: {e}"))));
    }
    answers
}

/// One closed-loop case's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub skus: usize,
    pub connections: usize,
    pub seconds: f64,
    pub requests: u64,
    #[serde(flatten)]
    pub answers: Answers,
    /// Accepted orders per second of the case's wall time.
    pub orders_per_second: f64,
    /// Latency of every request, from send to answer (503s retried included).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// `connections` buyers in a closed loop for `duration`, each order for a
/// SKU drawn at random from `skus`.
pub async fn throughput(
    target: &Target,
    skus: Vec<String>,
    connections: usize,
    duration: Duration,
) -> Result<Throughput, CliError> {
    let sku_count = skus.len();
    let skus = Arc::new(skus);
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (buyer, skus) = (target.buyer(), skus.clone());
            tokio::spawn(async move {
                let mut latency = new_histogram()?;
                let mut answers = Answers::default();
                let mut draw = Draw::seeded();
                while Instant::now() < deadline {
                    let sku = &skus[draw.below(skus.len())];
                    let sent = Instant::now();
                    let outcome = buyer.buy(sku).await;
                    let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                    latency.saturating_record(micros.max(1));
                    answers.count(outcome);
                }
                Ok::<_, CliError>((latency, answers))
            })
        })
        .collect();
    let mut latency = new_histogram()?;
    let mut answers = Answers::default();
    for joined in futures::future::join_all(workers).await {
        let (worker_latency, worker_answers) = joined.context("a throughput worker")??;
        latency.add(worker_latency).context("merging latencies")?;
        answers.merge(worker_answers);
    }
    let seconds = started.elapsed().as_secs_f64();
    let ms = |micros: u64| micros as f64 / 1000.0;
    Ok(Throughput {
        skus: sku_count,
        connections,
        seconds,
        requests: latency.len(),
        orders_per_second: answers.accepted as f64 / seconds,
        answers,
        p50_ms: ms(latency.value_at_quantile(0.5)),
        p99_ms: ms(latency.value_at_quantile(0.99)),
        max_ms: ms(latency.max()),
    })
}

fn new_histogram() -> Result<Histogram<u64>, CliError> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3).context("latency histogram")?)
}

/// A small per-worker generator (xorshift64): SKU draws need no more.
struct Draw(u64);

impl Draw {
    fn seeded() -> Draw {
        Draw(Uuid::new_v4().as_u64_pair().0 | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}
