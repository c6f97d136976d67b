//! Coalesced reservations: concurrent placements gathered into groups,
//! each group committed in one transaction (`place::place_group`). There is
//! no timer: a lane takes whatever is waiting when it is free, up to the
//! group limit, so a lone request is placed at once and under load a group
//! is whatever arrived while the lanes were busy. With coalescing off every
//! request is a group of one, placed on the request's own task.

use crate::error::ApiError;
use crate::place::{self, Answer, Context, Draft};
use crate::Coalesce;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, Mutex};

/// A draft, when it joined the queue, and where its answer goes.
type Job = (Draft, Instant, oneshot::Sender<Answer>);

/// Where a handler sends its draft.
pub(crate) enum Placer {
    /// Every request on its own.
    Direct(Arc<Context>),
    /// Requests queue for the lanes.
    Coalesced(mpsc::Sender<Job>),
}

impl Placer {
    /// A placer for `settings`; coalescing starts its lanes on the current runtime.
    pub(crate) fn new(ctx: Context, settings: Coalesce) -> Placer {
        let ctx = Arc::new(ctx);
        if !settings.enabled {
            return Placer::Direct(ctx);
        }
        let (tx, rx) = mpsc::channel(settings.max_group * settings.lanes * 2);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..settings.lanes {
            tokio::spawn(lane(ctx.clone(), rx.clone(), settings.max_group));
        }
        Placer::Coalesced(tx)
    }

    /// Places one request: alone, or with the group it joins.
    pub(crate) async fn place(&self, draft: Draft) -> Answer {
        match self {
            Placer::Direct(ctx) => place::place_group(ctx, std::slice::from_ref(&draft))
                .await
                .pop()
                .unwrap_or_else(|| Err(ApiError::Internal("no answer".into()))),
            Placer::Coalesced(queue) => {
                let (reply, answer) = oneshot::channel();
                queue
                    .send((draft, Instant::now(), reply))
                    .await
                    .map_err(|_| ApiError::Unavailable("checkout is shutting down".into()))?;
                answer
                    .await
                    .unwrap_or_else(|_| Err(ApiError::Internal("the placing group failed".into())))
            }
        }
    }
}

/// Takes the next group (blocking only for its first request) and places
/// it; a panic fails that group's requests, not the lane.
async fn lane(ctx: Arc<Context>, queue: Arc<Mutex<mpsc::Receiver<Job>>>, max: usize) {
    loop {
        let mut jobs = Vec::new();
        {
            let mut queue = queue.lock().await;
            match queue.recv().await {
                Some(job) => jobs.push(job),
                None => return,
            }
            while jobs.len() < max {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
        }
        let ctx = ctx.clone();
        let group = tokio::spawn(async move {
            let waited = metrics::histogram!("soldonce_checkout_queue_wait_seconds");
            let mut drafts = Vec::with_capacity(jobs.len());
            let mut replies = Vec::with_capacity(jobs.len());
            for (draft, queued, reply) in jobs {
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
