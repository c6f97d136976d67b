//! What a benchmark does to a database of its own between phases: empty
//! the order tables, and analyze the outbox the way autovacuum often leaves
//! a queue table between two bursts. Never for a database that holds
//! anyone's orders: the benchmarks call these only on the private servers
//! they start.

use crate::StoreError;
use sqlx::PgPool;

/// Empties every table an order writes to (the catalogue, stock, ledger
/// and accounts stay), in one statement. A service committing at the same
/// moment can deadlock with it: [`StoreError::is_transient`] then, and
/// running it again is the remedy.
pub async fn empty_order_tables(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::raw_sql(
        "TRUNCATE orders, order_lines, events, outbox, idempotency_keys, inbox, webhook_receipts, payments, shipments CASCADE",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `VACUUM (ANALYZE, TRUNCATE false)` of the outbox: the planner's figures
/// taken from the outbox as it is now, its file's pages kept (as the
/// relay's own vacuum keeps them).
pub async fn analyze_outbox(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::raw_sql("VACUUM (ANALYZE, TRUNCATE false) outbox")
        .execute(pool)
        .await?;
    Ok(())
}
