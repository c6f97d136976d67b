//! Idempotency keys scoped per account (the IETF Idempotency-Key draft):
//! the first request with a key claims it and stores its response; a retry
//! with the same fingerprint gets that response again; the same key with
//! another body is refused; a retry while the first is still running is told
//! so instead of waiting.

use crate::StoreError;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// An account's idempotency key and the fingerprint of its request.
#[derive(Debug, Clone, Copy)]
pub struct KeyedRequest<'a> {
    pub account_id: Uuid,
    pub key: &'a str,
    pub fingerprint: [u8; 32],
}

/// A response stored under a key.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: StoredBody,
    pub order_id: Option<Uuid>,
}

/// The body of a stored response.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredBody {
    /// Stored as it was sent (a refusal's problem document).
    Json(serde_json::Value),
    /// The order as it was placed, which a `202` shows. The order's first
    /// event holds it whole, so the key does not store it again (its
    /// `response_body` is NULL): a replay folds that event and renders the
    /// same body from it.
    Placed(Box<domain::Order>),
}

/// The outcome of trying to claim a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This request owns the key; its response is written with the claim.
    Claimed,
    /// Another request with this key has not finished.
    InFlight,
    /// The key was used before for the same request: answer this again.
    Replay(StoredResponse),
    /// The key was used before for a different request.
    Mismatch,
}

/// The lock that serialises requests with one key: a transaction-scoped
/// advisory lock taken with `try`, so a concurrent retry fails fast.
pub(crate) fn lock_id(req: &KeyedRequest<'_>) -> i64 {
    let h = Sha256::new()
        .chain_update(req.account_id.as_bytes())
        .chain_update(req.key.as_bytes())
        .finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    i64::from_be_bytes(b)
}

/// Deletes keys older than `retention`; returns how many went.
pub async fn purge(pool: &PgPool, retention: std::time::Duration) -> Result<u64, StoreError> {
    let secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let done = sqlx::query(
        "DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1)",
    )
    .bind(secs as f64)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
