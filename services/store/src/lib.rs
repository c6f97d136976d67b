//! soldonce's PostgreSQL store, the only crate with SQL: the event store
//! with its projections, stock buckets with their ledger, idempotency keys,
//! accounts, the outbox, and the consumers' inbox and dead letters.
//! PostgreSQL is the authority; every state change goes through the one
//! write path (`write`), which commits events, outbox rows, projections and
//! ledger rows together, set-based. This crate must never publish to the
//! bus or call out over the network.
//!
//! Layout:
//! - `write.rs` — the one write path: `Changes` gathered, then `commit`
//! - `statement.rs` — the write path's SQL builder: one statement of data-modifying CTEs, each fragment checked
//! - `journal.rs` — events with their outbox rows, appended in one statement
//! - `placing/` — placing orders, a whole group per transaction (coalesced reservations); a failing placement fails alone
//! - `orders/` — transitions, the projection's SQL, rows read back, loads and history
//! - `expiring.rs` — overdue reservations released on the database's clock, a bad row set aside
//! - `shipments/` — create, advance; the projection's SQL
//! - `stock.rs` — bucket movements per SKU per batch, with the ledger
//! - `catalog.rs` — products, prices, limits, receipts and adjustments
//! - `idempotency.rs`, `inbox.rs`, `dead_letters.rs`, `retention.rs` — dedupe records and their purge
//! - `outbox.rs` — what the relay claims, publishes and parks
//! - `stream_copy.rs` — what the stream must hold, from `events`, for its repair and audit
//! - `payments/`, `compensations.rs`, `reconcile.rs` — PSP facts, refunds owed, reconciliation state
//! - `disputes.rs`, `findings.rs` — chargebacks recorded and shipments held; findings a person acknowledges
//! - `accounts.rs` — accounts and bearer tokens
//! - `replication.rs` — positive confirmation that a commit is on the synchronous standbys
//! - `timeouts.rs` — how long each service's statements may wait on locks and run
//! - `clock.rs` — the database's clock, kept by every process (`now`)
//! - `metric_help.rs` — what each metric the store records means
//! - `connect.rs` — pools on one server or several (`DATABASE_URL` with a list of hosts), following the primary after a failover
//! - `console.rs` — the operator console's figures, in one snapshot
//! - `bench.rs`, `timings.rs` — what the benchmarks do between phases on their own servers, and how long orders took to each milestone
//! - `audit/` (the checks, the incremental audit and recorded runs), `projections.rs`, `rebuild.rs` (the projections rebuilt in batches beside live traffic), `replay.rs`, `order_counts.rs` — checks, rebuilds and reads for operators

pub mod accounts;
pub mod audit;
pub mod bench;
pub mod captures;
pub mod catalog;
pub mod clock;
pub mod compensations;
mod connect;
pub mod console;
pub mod dead_letters;
pub mod disputes;
pub mod expiring;
pub mod findings;
pub mod idempotency;
pub mod inbox;
mod journal;
pub mod operator_cancels;
pub mod operator_refunds;
pub mod order_counts;
pub mod orders;
pub mod outbox;
pub mod payments;
pub mod placing;
pub mod projections;
pub mod rebuild;
pub mod reconcile;
pub mod refunds_elsewhere;
pub mod replay;
pub mod replication;
pub mod retention;
pub mod shipments;
mod statement;
mod stock;
pub mod stream_copy;
pub mod timeouts;
pub mod timings;
mod write;

mod metric_help;
pub use metric_help::METRICS;

pub use connect::{connect, connect_with_settings, mirror, Target};
use sqlx::PgPool;

/// The schema, embedded once.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Infrastructure failures, kept apart from the domain's refusals.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("another writer changed order {0} first")]
    Conflict(uuid::Uuid),
    /// A writer that asked not to wait found an order another writer is
    /// deciding right now (its row locked): nothing was written.
    #[error("another writer is deciding order {0} right now")]
    Busy(uuid::Uuid),
    /// A commit that synchronous standbys were required to hold was not
    /// confirmed on them ([`replication::confirm`]): it may not survive a
    /// failover, so nothing may be answered or acknowledged on it yet.
    #[error("not confirmed on the synchronous standbys: {0}")]
    NotReplicated(String),
}

impl StoreError {
    /// Whether the error is a lost race a caller may retry.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict(_))
    }

    /// Whether a writer that asked not to wait found a row held.
    pub fn is_busy(&self) -> bool {
        matches!(self, StoreError::Busy(_))
    }

    /// Whether PostgreSQL aborted the transaction to break a deadlock or a
    /// serialization conflict (SQLSTATE `40P01`, `40001`): nothing of it was
    /// committed, and running it again is the documented remedy.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40P01" | "40001"))
            }
            _ => false,
        }
    }
}

/// A readiness probe that passes while PostgreSQL answers.
pub fn readiness(pool: PgPool) -> platform::ops::ReadinessCheck {
    std::sync::Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&pool)
                .await
                .map(|_| ())
                .map_err(|e| {
                    tracing::warn!(error = %e, "readiness: PostgreSQL did not answer");
                    "postgres is unreachable".to_owned()
                })
        })
    })
}

/// Applies every pending migration.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

/// The name of the constraint a database error violated, if any.
pub(crate) fn violated_constraint(err: &sqlx::Error) -> Option<&str> {
    err.as_database_error().and_then(|e| e.constraint())
}

pub use clock::now;

impl StoreError {
    /// Whether the database was busy or unreachable: the caller may retry
    /// later; nothing is wrong with the request or the data.
    /// A statement that waited past its service's `lock_timeout` or
    /// `statement_timeout` ([`timeouts`]) counts: a row held by a stuck
    /// connection, not a fault of the request.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(
                sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed,
            ) => true,
            StoreError::Database(sqlx::Error::Database(e)) => {
                timeouts::timed_out(e.code().as_deref())
            }
            StoreError::NotReplicated(_) => true,
            _ => false,
        }
    }
}
