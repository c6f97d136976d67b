//! Coalesced reservations: concurrent placements gathered into groups,
//! each group committed in one transaction (`place::place_group`). There is
//! no timer: a lane takes whatever is waiting when it is free, up to the
//! group limit, so a lone request is placed at once and under load a group
//! is whatever arrived while the lanes were busy. With coalescing off every
//! request is a group of one, placed on the request's own task.
//!
//! A request waits for a lane at most `queue_deadline`: past it, it is
//! answered `503` (`overloaded`, with `Retry-After`) and its draft is marked
//! abandoned, so the lane that reaches it later skips it — nothing is
//! reserved for an answer nobody waits for. Whichever of the two marks the
//! draft first wins; a draft a lane took is always answered by the lane.

use crate::error::ApiError;
use crate::place::{self, Answer, Context, Draft};
use platform::config::{self, ConfigError};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Mutex};

/// Coalesced reservations: concurrent placements are gathered and committed
/// together, one transaction per group, so a hot SKU's row is locked and
/// flushed once per group rather than once per order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalesce {
    /// `CHECKOUT_COALESCE` (`on`/`off`, default `on`): off commits every
    /// placement in a transaction of its own.
    pub enabled: bool,
    /// `CHECKOUT_COALESCE_MAX`, default 256: the most placements in one group.
    pub max_group: usize,
    /// `CHECKOUT_COALESCE_LANES`, by default one per core, at most 4
    /// ([`platform::runtime::per_core`]): groups in flight at once (each
    /// holds one connection); the next group forms while they run.
    pub lanes: usize,
    /// `CHECKOUT_QUEUE_DEADLINE`, default 5 s: how long a placement may wait
    /// for a lane; past it the request is answered `503` with `Retry-After`
    /// and nothing is reserved.
    pub queue_deadline: Duration,
    /// `CHECKOUT_COALESCE_THREAD` (`shared`/`own`, default `shared`): `own`
    /// runs the lanes on a thread of their own, with connections of their
    /// own, so a hot SKU's row is released without waiting for the request
    /// threads (more orders a second on one SKU, checkout alone); on a host
    /// whose cores checkout shares with PostgreSQL and the consumers, the
    /// lanes' smaller groups cost the whole saga more CPU per order.
    pub own_thread: bool,
}

impl Default for Coalesce {
    fn default() -> Self {
        Coalesce {
            enabled: true,
            max_group: 256,
            lanes: platform::runtime::per_core(4),
            queue_deadline: Duration::from_secs(5),
            own_thread: false,
        }
    }
}

impl Coalesce {
    /// Reads `CHECKOUT_COALESCE`, `CHECKOUT_COALESCE_MAX`, `CHECKOUT_COALESCE_LANES`,
    /// `CHECKOUT_QUEUE_DEADLINE` and `CHECKOUT_COALESCE_THREAD`.
    pub fn from_env() -> Result<Self, ConfigError> {
        let d = Coalesce::default();
        let enabled = switch()?.unwrap_or(d.enabled);
        let max_group = config::var(
            "CHECKOUT_COALESCE_MAX",
            "the most placements committed in one transaction (1–10000)",
        )
        .in_range(d.max_group, 1..=10_000)?;
        let lanes = config::var(
            "CHECKOUT_COALESCE_LANES",
            "placing groups in flight at once, each holding one connection (1–64)",
        )
        .default_shown_as("one per core, at most 4")
        .in_range(d.lanes, 1..=64)?;
        let queue_deadline = config::var(
            "CHECKOUT_QUEUE_DEADLINE",
            "how long a placement may wait for a free lane; past it 503 with Retry-After, nothing reserved",
        )
        .duration(d.queue_deadline)?;
        if queue_deadline.is_zero() {
            return Err(ConfigError::new(
                "CHECKOUT_QUEUE_DEADLINE",
                "must be longer than zero",
            ));
        }
        let own_thread = thread()?.unwrap_or(d.own_thread);
        Ok(Coalesce {
            enabled,
            max_group,
            lanes,
            queue_deadline,
            own_thread,
        })
    }
}

/// `CHECKOUT_COALESCE`: on or off, when set.
fn switch() -> Result<Option<bool>, ConfigError> {
    config::var(
        "CHECKOUT_COALESCE",
        "on gathers concurrent placements into one transaction per group; off commits each in its own",
    )
    .default_shown_as("on")
    .either(&["on", "true", "1", "yes"], &["off", "false", "0", "no"])
}

/// `CHECKOUT_COALESCE_THREAD`: whether the lanes have a thread of their own, when set.
fn thread() -> Result<Option<bool>, ConfigError> {
    config::var(
        "CHECKOUT_COALESCE_THREAD",
        "own runs the placing lanes on a thread of their own (a hot SKU's row held for less; smaller groups); shared runs them on the request threads",
    )
    .default_shown_as("shared")
    .either(&["own"], &["shared"])
}

/// A draft, when it joined the queue, whether it is still wanted, and where its answer goes.
type Job = (Draft, Instant, Arc<AtomicU8>, oneshot::Sender<Answer>);

/// A queued draft's fate: still waiting, taken by a lane, or abandoned by its request.
const WAITING: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// Where a handler sends its draft.
pub(crate) enum Placer {
    /// Every request on its own.
    Direct(Arc<Context>),
    /// Requests queue for the lanes, each at most `deadline`.
    Coalesced {
        queue: mpsc::Sender<Job>,
        deadline: Duration,
    },
}

impl Placer {
    /// A placer for `settings`; coalescing starts its lanes, on the
    /// current runtime or on a thread of their own (see [`start_lanes`]).
    pub(crate) fn new(ctx: Context, settings: Coalesce) -> std::io::Result<Placer> {
        if !settings.enabled {
            return Ok(Placer::Direct(Arc::new(ctx)));
        }
        let (tx, rx) = mpsc::channel(settings.max_group * settings.lanes * 2);
        if settings.own_thread {
            start_lanes(ctx, rx, settings)?;
        } else {
            spawn_lanes(ctx, rx, settings);
        }
        Ok(Placer::Coalesced {
            queue: tx,
            deadline: settings.queue_deadline,
        })
    }

    /// Places one request: alone, or with the group it joins.
    pub(crate) async fn place(&self, draft: Draft) -> Answer {
        match self {
            Placer::Direct(ctx) => place::place_group(ctx, std::slice::from_ref(&draft))
                .await
                .pop()
                .unwrap_or_else(|| Err(ApiError::Internal("no answer".into()))),
            Placer::Coalesced { queue, deadline } => {
                let (reply, mut answer) = oneshot::channel();
                let fate = Arc::new(AtomicU8::new(WAITING));
                let queued = Instant::now();
                let sent = tokio::time::timeout(
                    *deadline,
                    queue.send((draft, queued, fate.clone(), reply)),
                )
                .await;
                match sent {
                    Err(_) => return Err(overloaded(queued)),
                    Ok(Err(_)) => {
                        return Err(ApiError::Unavailable("checkout is shutting down".into()))
                    }
                    Ok(Ok(())) => queued_gauge().increment(1.0),
                }
                let left = deadline.saturating_sub(queued.elapsed());
                if let Ok(answered) = tokio::time::timeout(left, &mut answer).await {
                    return answered.unwrap_or_else(|_| {
                        Err(ApiError::Internal("the placing group failed".into()))
                    });
                }
                if fate
                    .compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Err(overloaded(queued));
                }
                // A lane took it in time: its answer (202 or not) is the answer.
                answer
                    .await
                    .unwrap_or_else(|_| Err(ApiError::Internal("the placing group failed".into())))
            }
        }
    }
}

/// A request that waited too long for a lane.
fn overloaded(queued: Instant) -> ApiError {
    metrics::counter!("soldonce_checkout_queue_deadline_total").increment(1);
    ApiError::Overloaded(queued.elapsed())
}

/// Placements waiting in the queue for a lane.
fn queued_gauge() -> metrics::Gauge {
    metrics::gauge!("soldonce_checkout_queued_placements")
}

/// Whether a lane may place this draft: it was still waiting (not abandoned).
fn take(fate: &AtomicU8) -> bool {
    fate.compare_exchange(WAITING, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// Starts the lanes on a thread of their own, with a runtime and database
/// connections of their own (`CHECKOUT_COALESCE_THREAD=own`); they stop
/// when the placer is dropped.
///
/// A hot SKU's row stays locked from a group's stock update until its
/// commit returns, and in between the lane must read the statement's reply
/// and send `COMMIT`. On the request threads, that wake-up would queue
/// behind the HTTP connections' tasks (a busy runtime looks at its sockets
/// only every few dozen tasks, and `soldonce up` gives checkout one
/// thread), so every buyer of the SKU would wait for the slowest of them.
/// The lanes' thread is idle but for them: it is woken by the kernel as
/// soon as PostgreSQL answers. The lanes then come round sooner and take
/// smaller groups: more transactions per order, which on a host whose few
/// cores checkout shares with PostgreSQL and the consumers cost the whole
/// saga more than the row's shorter hold gains (see docs/benchmarks.md),
/// hence not the default.
fn start_lanes(ctx: Context, rx: mpsc::Receiver<Job>, settings: Coalesce) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("checkout-lanes".into())
        .spawn(move || runtime.block_on(run_lanes(ctx, rx, settings)))?;
    Ok(())
}

/// The lanes, on the lanes' runtime, with a pool like the request
/// threads' (the same settings and server, following it after a failover)
/// holding at most one connection per lane.
async fn run_lanes(ctx: Context, rx: mpsc::Receiver<Job>, settings: Coalesce) {
    let pool = store::mirror(&ctx.pool, u32::try_from(settings.lanes).unwrap_or(u32::MAX));
    let ctx = Context {
        pool: pool.clone(),
        ..ctx
    };
    for lane in spawn_lanes(ctx, rx, settings) {
        if let Err(e) = lane.await {
            tracing::error!(error = %e, "a placing lane stopped");
        }
    }
    pool.close().await;
}

/// Spawns `settings.lanes` lanes on the current runtime, sharing `rx`.
fn spawn_lanes(
    ctx: Context,
    rx: mpsc::Receiver<Job>,
    settings: Coalesce,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (ctx, rx) = (Arc::new(ctx), Arc::new(Mutex::new(rx)));
    (0..settings.lanes)
        .map(|_| tokio::spawn(lane(ctx.clone(), rx.clone(), settings.max_group)))
        .collect()
}

/// Takes the next group (blocking only for its first request) and places
/// it; a panic fails that group's requests, not the lane.
async fn lane(ctx: Arc<Context>, queue: Arc<Mutex<mpsc::Receiver<Job>>>, max: usize) {
    loop {
        let mut jobs = Vec::new();
        {
            let mut queue = queue.lock().await;
            while jobs.is_empty() {
                let Some(job) = queue.recv().await else {
                    return;
                };
                queued_gauge().decrement(1.0);
                if take(&job.2) {
                    jobs.push(job);
                }
            }
            while jobs.len() < max {
                let Ok(job) = queue.try_recv() else {
                    break;
                };
                queued_gauge().decrement(1.0);
                if take(&job.2) {
                    jobs.push(job);
                }
            }
        }
        let ctx = ctx.clone();
        let group = tokio::spawn(async move {
            let waited = metrics::histogram!("soldonce_checkout_queue_wait_seconds");
            let mut drafts = Vec::with_capacity(jobs.len());
            let mut replies = Vec::with_capacity(jobs.len());
            for (draft, queued, _, reply) in jobs {
                waited.record(queued.elapsed().as_secs_f64());
                drafts.push(draft);
                replies.push(reply);
            }
            let answers = place::place_group(&ctx, &drafts).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
        if let Err(e) = group.await {
            tracing::error!(error = %e, "a placing group panicked");
        }
    }
}
