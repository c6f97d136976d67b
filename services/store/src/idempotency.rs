//! Idempotency keys scoped per account (the IETF Idempotency-Key draft):
//! the first request with a key claims it and stores its response; a retry
//! with the same fingerprint gets that response again; the same key with
//! another body is refused; a retry while the first is still running is told
//! so instead of waiting.

use crate::StoreError;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
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
    pub body: serde_json::Value,
    pub order_id: Option<Uuid>,
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
fn lock_id(req: &KeyedRequest<'_>) -> i64 {
    let h = Sha256::new()
        .chain_update(req.account_id.as_bytes())
        .chain_update(req.key.as_bytes())
        .finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    i64::from_be_bytes(b)
}

/// Claims the key inside the caller's transaction, storing `response` as
/// its answer; the caller's commit makes claim and effect visible together.
pub async fn claim(
    conn: &mut PgConnection,
    req: &KeyedRequest<'_>,
    response: &StoredResponse,
) -> Result<Claim, StoreError> {
    let (got, inserted): (bool, bool) = sqlx::query_as(
        "WITH l AS (SELECT pg_try_advisory_xact_lock($1) AS got), \
              i AS (INSERT INTO idempotency_keys (account_id, key, fingerprint, status, response_body, order_id) \
                    SELECT $2, $3, $4, $5, $6, $7 FROM l WHERE got ON CONFLICT DO NOTHING RETURNING 1) \
         SELECT (SELECT got FROM l), EXISTS (SELECT 1 FROM i)",
    )
    .bind(lock_id(req))
    .bind(req.account_id)
    .bind(req.key)
    .bind(req.fingerprint.as_slice())
    .bind(i16::try_from(response.status).unwrap_or(500))
    .bind(&response.body)
    .bind(response.order_id)
    .fetch_one(&mut *conn)
    .await?;
    if !got {
        return Ok(Claim::InFlight);
    }
    if inserted {
        return Ok(Claim::Claimed);
    }
    let (fingerprint, status, body, order_id): (Vec<u8>, i16, serde_json::Value, Option<Uuid>) = sqlx::query_as(
        "SELECT fingerprint, status, response_body, order_id FROM idempotency_keys WHERE account_id = $1 AND key = $2",
    )
    .bind(req.account_id)
    .bind(req.key)
    .fetch_one(&mut *conn)
    .await?;
    if fingerprint != req.fingerprint {
        return Ok(Claim::Mismatch);
    }
    let status =
        u16::try_from(status).map_err(|_| StoreError::Corrupt("idempotency status".into()))?;
    Ok(Claim::Replay(StoredResponse {
        status,
        body,
        order_id,
    }))
}

/// Records a final response that changed nothing (e.g. out of stock) under
/// the key, in a transaction of its own.
pub async fn record(
    pool: &PgPool,
    req: &KeyedRequest<'_>,
    response: &StoredResponse,
) -> Result<Claim, StoreError> {
    let mut tx = pool.begin().await?;
    let claim = claim(&mut tx, req, response).await?;
    tx.commit().await?;
    Ok(claim)
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
