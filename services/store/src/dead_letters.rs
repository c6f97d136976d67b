//! Dead letters: messages a consumer can never handle (an invalid envelope,
//! an unknown type or version, a message out of deliveries), kept with
//! their reason so an operator can read them; the audit counts them.

use crate::StoreError;
use events::DeadLetter;
use sqlx::PgPool;

/// Keeps one dead letter.
pub async fn record(pool: &PgPool, letter: &DeadLetter) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO dead_letters (consumer, stream_seq, subject, payload, reason) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&letter.consumer)
    .bind(i64::try_from(letter.stream_seq).unwrap_or(-1))
    .bind(&letter.subject)
    .bind(&letter.payload)
    .bind(&letter.reason)
    .execute(pool)
    .await?;
    Ok(())
}
