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

/// The SHA-256 digest a token is stored as.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
