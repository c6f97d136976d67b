//! The webhooks' share of the database pool: a bulkhead that every
//! webhook path that writes (payments, refunds, disputes) takes a slot of.

use crate::error::ApiError;
use crate::AppState;

/// A bulkhead: webhooks that write take at most a quarter of the pool, so
/// however many arrive (and however long they wait on order rows a payment
/// batch holds), placements always find connections. Their looks take
/// none of it. The PSP retries the `503`.
pub(crate) async fn writing_slot(
    state: &AppState,
) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        state.webhook_slots.acquire(),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .ok_or_else(|| ApiError::Unavailable("too many webhooks in progress".into()))
}
