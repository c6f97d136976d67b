//! The test harness: one private PostgreSQL and one private NATS JetStream
//! server per test process, started from PATH on first use; a fresh
//! database per test, cloned from a migrated template; the real services
//! started in-process on port 0; typed helpers for their APIs.
//!
//! Layout:
//! - `harness/app.rs` — `TestApp`: checkout in-process on its own database
//! - `harness/servers.rs` — the process's private PostgreSQL and NATS
//! - `harness/saga.rs` — the whole saga in-process, with psp-sim
//! - `harness/system.rs` — every service as a real process, to kill and restart
//! - `harness/relay.rs` — the service binaries and the relay as a process
//! - `harness/poll.rs` — `eventually`: poll with a deadline, never sleep
//! - `main.rs` and its folders — the end-to-end tests, by area

#[path = "harness/app.rs"]
pub mod app;
#[path = "harness/poll.rs"]
pub mod poll;
#[path = "harness/relay.rs"]
pub mod relay;
#[path = "harness/saga.rs"]
pub mod saga;
#[path = "harness/servers.rs"]
pub mod servers;
#[path = "harness/system.rs"]
pub mod system;

pub use app::TestApp;
pub use poll::eventually;

/// Every plan node under `plan` (an `EXPLAIN (FORMAT JSON)` plan's
/// `Plan`), depth first.
pub fn plan_nodes(plan: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut out = vec![plan.clone()];
    for child in plan["Plans"].as_array().into_iter().flatten() {
        out.extend(plan_nodes(child));
    }
    out
}

/// The value of one sample in a Prometheus text exposition: the line whose
/// name, with its labels if it has any, is exactly `sample`.
pub fn metric_sample(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(sample)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The node types of an `EXPLAIN (FORMAT JSON)` answer, depth first.
pub fn plan_kinds(explained: &serde_json::Value) -> Vec<String> {
    plan_nodes(&explained[0]["Plan"])
        .iter()
        .filter_map(|n| n["Node Type"].as_str().map(str::to_owned))
        .collect()
}

/// Flushes the counts of what `pool`'s one session has read so far into
/// PostgreSQL's statistics (it keeps them in the session until it flushes
/// them, at most once a second).
async fn flush_counts(pool: &sqlx::PgPool) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .expect("flush the session's counts so far");
}

/// A transaction on `pool`, a pool of one connection (see
/// [`one_connection_pool`]), whose counts of what it reads
/// (`pg_stat_xact_user_tables`, `pg_stat_get_xact_tuples_returned`) start
/// from zero: the session's counts so far are flushed first (PostgreSQL
/// keeps them in the session until it flushes them, at most once a second,
/// and its "transaction" counts include them until then). On a pool of
/// more connections the flush could reach another session.
pub async fn counted_transaction(
    pool: &sqlx::PgPool,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    flush_counts(pool).await;
    pool.begin().await.expect("a transaction")
}

/// Rows the transaction on `conn` has read by scanning `table` whole so
/// far (begun with [`counted_transaction`], so that the count starts at
/// zero).
pub async fn xact_rows_scanned(conn: &mut sqlx::PgConnection, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(seq_tup_read), 0)::bigint FROM pg_stat_xact_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .expect("the transaction's reads")
}

/// Rows PostgreSQL has read by scanning `table` whole, over every session
/// so far. `pool`'s session flushes its own counts first (see
/// [`counted_transaction`]): read it before and after a call on a pool of
/// one connection to count the rows the call scanned.
pub async fn rows_scanned(pool: &sqlx::PgPool, table: &str) -> i64 {
    flush_counts(pool).await;
    sqlx::query_scalar(
        "SELECT coalesce(sum(seq_tup_read), 0)::bigint FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .expect("the rows read by scanning")
}

/// Runs `statements` in order on `pool`, panicking with the one that failed.
pub async fn run_all(pool: &sqlx::PgPool, statements: &[&str]) {
    for sql in statements {
        sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// A pool of one connection to `url` whose plans are made on the
/// statistics of `tables` as they are now, frozen (analyzed, then left alone
/// by autovacuum) however the tables grow, as a new store's connections see
/// them before autovacuum catches up; `statements` run on it first (a
/// `PREPARE` to compare against, say).
pub async fn pool_on_frozen_statistics(
    url: &str,
    tables: &[&str],
    statements: &[&str],
) -> sqlx::PgPool {
    let pool = one_connection_pool(url).await;
    for table in tables {
        run_all(
            &pool,
            &[
                &format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
                &format!("ANALYZE {table}"),
            ],
        )
        .await;
    }
    run_all(&pool, statements).await;
    pool
}

/// Asserts that each of `statements` is kept prepared on `pool`'s one
/// connection: each call of it is one round trip.
pub async fn assert_kept_prepared(pool: &sqlx::PgPool, statements: &[&str]) {
    let prepared: Vec<String> = sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
        .fetch_all(pool)
        .await
        .expect("the connection's prepared statements");
    for sql in statements {
        assert!(
            prepared.iter().any(|p| p == sql),
            "kept prepared on the connection (one round trip): {sql}"
        );
    }
}

/// Runs `execute`, the `EXECUTE` of a statement prepared on `pool`'s one
/// connection while `table` was empty, and asserts that the plan it kept
/// reads the grown table (of 20,000 rows or more) whole: the control that
/// shows what a test's function avoids.
pub async fn assert_kept_plan_scans(pool: &sqlx::PgPool, table: &str, execute: &str) {
    let before = rows_scanned(pool, table).await;
    sqlx::query(execute)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{execute}: {e}"));
    let kept = rows_scanned(pool, table).await - before;
    assert!(
        kept >= 20_000,
        "the plan kept from the empty {table} scans the grown one ({kept} rows read): what the function avoids"
    );
}

/// A pool of one connection to `url`: every statement sent through it runs
/// in the same session (its prepared statements, its reloaded settings).
pub async fn one_connection_pool(url: &str) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("a one-connection pool")
}

/// The entries of each of these B-tree indexes, which must be small enough
/// to fit one leaf page (0 for one that never held any), dead ones
/// included: an update that is not HOT adds one to each index whose
/// condition its new row meets, and a HOT update adds none. Needs
/// `pageinspect`, created here.
pub async fn index_entries(pool: &sqlx::PgPool, indexes: &[&str]) -> Vec<i64> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pageinspect")
        .execute(pool)
        .await
        .expect("pageinspect");
    let mut entries = Vec::with_capacity(indexes.len());
    for index in indexes {
        // An index that never held an entry has only its metapage.
        let pages: i64 = sqlx::query_scalar(
            "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint",
        )
        .bind(index)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{index}: {e}"));
        if pages < 2 {
            entries.push(0);
            continue;
        }
        // Past one leaf page, the first would hold only some of the entries.
        assert_eq!(pages, 2, "{index} has outgrown one leaf page");
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM bt_page_items($1, 1)")
            .bind(index)
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{index}: {e}"));
        entries.push(n);
    }
    entries
}
