//! The database connection every command that reads or writes uses.

use crate::CliError;
use anyhow::Context;
use sqlx::PgPool;

/// Connects using DATABASE_URL.
pub async fn pool() -> Result<PgPool, CliError> {
    let url = platform::config::database_url().map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(store::connect(&url, 4)
        .await
        .context("connecting to DATABASE_URL")?)
}
