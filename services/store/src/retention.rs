//! How long dedupe records are kept: idempotency keys, the consumers'
//! inbox and webhook receipts, each purged past the retention.

use crate::StoreError;
use sqlx::PgPool;

/// Deletes idempotency keys, inbox rows and webhook receipts older than `retention`.
pub async fn purge(pool: &PgPool, retention: std::time::Duration) -> Result<u64, StoreError> {
    let mut purged = crate::idempotency::purge(pool, retention).await?;
    purged += crate::inbox::purge(pool, retention).await?;
    purged += sqlx::query(
        "DELETE FROM webhook_receipts WHERE received_at < now() - make_interval(secs => $1)",
    )
    .bind(retention.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    Ok(purged)
}
