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

/// Adds `skus` to the catalogue at `price_minor` (BRL), each with `units`
/// received, in one statement of plain SQL on columns every schema since
/// the first has: `soldonce bench compare` seeds both builds' databases
/// with the measuring build's code, and a build before a migration must
/// be seeded all the same.
pub async fn seed_products(
    pool: &PgPool,
    skus: &[&str],
    price_minor: i64,
    units: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH p AS (INSERT INTO products (sku, name, price_minor, currency) \
                    SELECT sku, 'bench product', $2, 'BRL' FROM unnest($1::text[]) AS x(sku) RETURNING sku), \
              s AS (INSERT INTO stock (sku, available) SELECT sku, $3 FROM p RETURNING sku) \
         INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, reason) \
         SELECT sku, 'receive', $3, 0, 0, 'benchmark' FROM s",
    )
    .bind(skus)
    .bind(price_minor)
    .bind(units)
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
