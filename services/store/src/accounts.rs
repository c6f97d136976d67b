//! Accounts and their API tokens, stored as SHA-256 digests.

use crate::StoreError;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// A new account and the only copy of its clear token.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NewAccount {
    pub account_id: Uuid,
    pub name: String,
    pub token: String,
}

fn fresh_token() -> String {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    format!("so_{}", hex::encode(secret))
}

/// Revokes every token of `account`; how many there were (`None`: no such
/// account). Running checkouts refuse them within their cache's lifetime
/// (5 s).
pub async fn revoke(pool: &PgPool, account: Uuid) -> Result<Option<u64>, StoreError> {
    let mut tx = pool.begin().await?;
    if !exists(&mut tx, account).await? {
        return Ok(None);
    }
    let n = sqlx::query("DELETE FROM api_tokens WHERE account_id = $1")
        .bind(account)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(Some(n))
}

/// Replaces every token of `account` with one fresh token (shown once), in
/// one transaction; `None`: no such account.
pub async fn rotate(pool: &PgPool, account: Uuid) -> Result<Option<NewAccount>, StoreError> {
    let mut tx = pool.begin().await?;
    let name: Option<String> =
        sqlx::query_scalar("SELECT name FROM accounts WHERE id = $1 FOR UPDATE")
            .bind(account)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(name) = name else {
        return Ok(None);
    };
    sqlx::query("DELETE FROM api_tokens WHERE account_id = $1")
        .bind(account)
        .execute(&mut *tx)
        .await?;
    let token = fresh_token();
    sqlx::query("INSERT INTO api_tokens (token_sha256, account_id) VALUES ($1, $2)")
        .bind(digest(&token).as_slice())
        .bind(account)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(NewAccount {
        account_id: account,
        name,
        token,
    }))
}

async fn exists(conn: &mut sqlx::PgConnection, account: Uuid) -> Result<bool, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM accounts WHERE id = $1)")
            .bind(account)
            .fetch_one(conn)
            .await?,
    )
}

/// Creates an account with one fresh token.
pub async fn create(pool: &PgPool, name: &str) -> Result<NewAccount, StoreError> {
    let account_id = Uuid::now_v7();
    let token = fresh_token();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO accounts (id, name) VALUES ($1, $2)")
        .bind(account_id)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO api_tokens (token_sha256, account_id) VALUES ($1, $2)")
        .bind(digest(&token).as_slice())
        .bind(account_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(NewAccount {
        account_id,
        name: name.to_owned(),
        token,
    })
}

/// The account a clear token belongs to.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<Uuid>, StoreError> {
    let row: Option<(Uuid,)> =
        sqlx::query_as("SELECT account_id FROM api_tokens WHERE token_sha256 = $1")
            .bind(digest(token).as_slice())
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|r| r.0))
}

/// Where a reader of newly issued tokens takes up: the oldest transaction
/// its last read could not see (a snapshot's `xmin`). Every token that read
/// missed was issued by a transaction at or after it, however late that
/// transaction committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuedSince(i64);

/// Where a reader that has seen nothing yet takes up: call it before
/// reading [`token_digests`], then read [`issued_since`] from it.
pub async fn issued_horizon(pool: &PgPool) -> Result<IssuedSince, StoreError> {
    let xmin: i64 =
        sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            .fetch_one(pool)
            .await?;
    Ok(IssuedSince(xmin))
}

/// One page of every stored token digest, in digest order, after `after`.
pub async fn token_digests(
    pool: &PgPool,
    after: Option<&[u8; 32]>,
    limit: i64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    let rows: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT token_sha256 FROM api_tokens WHERE token_sha256 > $1
         ORDER BY token_sha256 LIMIT $2",
    )
    // The empty string sorts before every digest.
    .bind(after.map_or(&[][..], |a| a.as_slice()))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(digest_of).collect()
}

/// The digests of tokens issued by transactions at or after `since`, and
/// where the next read takes up, in one snapshot. It reads a few rows: those
/// issued since the oldest transaction still open at the last read.
pub async fn issued_since(
    pool: &PgPool,
    since: IssuedSince,
) -> Result<(Vec<[u8; 32]>, IssuedSince), StoreError> {
    let (xmin, rows): (i64, Vec<Vec<u8>>) = sqlx::query_as(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
                coalesce(array_agg(token_sha256), '{}')
         FROM api_tokens WHERE issued_xid >= ($1::bigint)::text::xid8",
    )
    .bind(since.0)
    .fetch_one(pool)
    .await?;
    let digests = rows.into_iter().map(digest_of).collect::<Result<_, _>>()?;
    Ok((digests, IssuedSince(xmin)))
}

fn digest_of(bytes: Vec<u8>) -> Result<[u8; 32], StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map_err(|b| StoreError::Corrupt(format!("a token digest of {} bytes", b.len())))
}

/// The SHA-256 digest a token is stored as.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
