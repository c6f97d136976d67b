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

/// Creates an account with one fresh token.
pub async fn create(pool: &PgPool, name: &str) -> Result<NewAccount, StoreError> {
    let account_id = Uuid::now_v7();
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let token = format!("so_{}", hex::encode(secret));
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
