//! What a benchmark does to a database of its own between phases: empty
//! the order tables, leave WAL segments ready for reuse, and analyze the
//! outbox the way autovacuum often leaves a queue table between two
//! bursts. Never for a database that holds anyone's orders: the
//! benchmarks call these only on the private servers they start.

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

/// WAL segments [`recycle_wal_segments`] leaves ready: 80 MB, PostgreSQL's
/// default `min_wal_size`, which is what a checkpoint keeps for reuse.
pub const WAL_SEGMENTS_READY: u32 = 5;

/// Leaves WAL segments ready for reuse, as a database that has been taking
/// writes has them. A new cluster has none: every 16 MB of WAL, a backend
/// creates the next segment, writing 16 MB of zeros and syncing them while
/// it holds the WAL write lock, and every commit waits meanwhile (sampled
/// at 300 orders/s: about 75 ms, once every 5 s). A running database's
/// checkpoints rename the segments they are done with for reuse, up to
/// `min_wal_size`. Here each of a few switches to a new segment creates
/// one, and a checkpoint then recycles them; the first writes after it
/// also write each page's full image once, as after any checkpoint.
pub async fn recycle_wal_segments(pool: &PgPool) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    for _ in 0..=WAL_SEGMENTS_READY {
        // A switch creates nothing unless something was written since the last.
        sqlx::query("SELECT pg_logical_emit_message(false, 'soldonce-bench', '')")
            .execute(&mut *conn)
            .await?;
        sqlx::query("SELECT pg_switch_wal()")
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("CHECKPOINT").execute(&mut *conn).await?;
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
