//! The audit: proves soldonce's invariants from the database, read in one
//! REPEATABLE READ snapshot (so live traffic never shows as a violation) and
//! streamed (memory stays flat however many orders there are).
//! - per SKU, `reserved` = units on `payment_pending` orders, `sold` = units
//!   on confirmed orders, and each bucket = its ledger sum;
//! - each order's projection row = the fold of its events, and (full pass)
//!   no event id names two events and every row names what exists (its
//!   order, account or product);
//! - money: no order confirmed twice; every confirmed order's payment is
//!   attached to it and every attached payment settles its order; every
//!   decided refund is carried out within `compensation_grace`; every
//!   refund the PSP confirmed is recorded on its order; the last
//!   reconciliation against the PSP found nothing it could not repair;
//! - operations: confirmed orders shipped within `shipment_grace`, no dead
//!   letters, no outbox rows parked as unpublishable, the outbox drained
//!   within `max_outbox_age`.
//!
//! That is the full pass ([`full`]). The periodic audit is [`incremental`]
//! (`delta.rs`): it checks only the orders with events the last recorded
//! run had not seen, and each SKU's buckets against that run's ledger sums
//! plus the ledger rows added since, so its snapshot is short however many
//! orders there are; it falls back to a full pass when none was recorded or
//! the last is older than `full_every`. Runs are recorded (`audit_runs`), so
//! the console shows the last one instead of running its own.
//!
//! Layout:
//! - `mod.rs` — the passes: full, incremental, each in its snapshots
//! - `report.rs` — what an audit found, its options, full or incremental
//! - `stock.rs` — each SKU's buckets against its ledger and its orders
//! - `projection.rs` — each order's projection row against the fold of its events; event ids named twice
//! - `references.rs` — rows that name an order, account or product that does not exist
//! - `money.rs` — payments, refunds, captures and reconciliation; open findings
//! - `operations.rs` — shipments, dead letters, parked and lagging outbox rows
//! - `delta.rs`, `frontier.rs` — where the last run stopped and what came after
//! - `runs.rs` — recorded runs, and when the last full pass was

mod delta;
mod frontier;
mod money;
mod operations;
mod projection;
mod references;
mod report;
mod runs;
mod stock;

use crate::StoreError;
use delta::Checkpoint;
use operations::check_operations;
use projection::{check_event_ids, check_projection};
use references::check_references;
use sqlx::{PgConnection, PgPool};
use stock::check_stock;

pub use report::{AuditKind, AuditOptions, AuditReport, Violation, MAX_LISTED};
pub use runs::{last, Audit, RecordedAudit};

/// A full pass, not recorded.
pub async fn run(pool: &PgPool, options: &AuditOptions) -> Result<AuditReport, StoreError> {
    Ok(full(pool, options).await?.report)
}

/// Every check over every order, in one read-only snapshot.
pub async fn full(pool: &PgPool, options: &AuditOptions) -> Result<Audit, StoreError> {
    let clock = std::time::Instant::now();
    let mut tx = snapshot(pool).await?;
    let started_at = db_now(&mut tx).await?;
    let mut report = AuditReport::default();
    let sums = check_stock(&mut tx, &mut report).await?;
    check_projection(&mut tx, None, &mut report).await?;
    check_event_ids(&mut tx, &mut report).await?;
    check_references(&mut tx, &mut report).await?;
    money::check(&mut tx, options, None, &mut report).await?;
    check_operations(&mut tx, options, true, &mut report).await?;
    let checkpoint = delta::of_full_pass(&mut tx, options, sums).await?;
    finish(tx, report, checkpoint, started_at, clock).await
}

/// The changes since the last recorded run's checkpoint, or a full pass
/// when there is none or the last full pass is older than `full_every`.
pub async fn incremental(pool: &PgPool, options: &AuditOptions) -> Result<Audit, StoreError> {
    let due = runs::full_pass_due(pool, options.full_every).await?;
    let base = if due { None } else { delta::load(pool).await? };
    match base {
        Some(base) => changes_since(pool, options, base).await,
        None => full(pool, options).await,
    }
}

/// The incremental checks over every order (as if nothing had ever been
/// audited): they must agree with [`full`], which tests hold them to.
pub async fn incremental_from_scratch(
    pool: &PgPool,
    options: &AuditOptions,
) -> Result<AuditReport, StoreError> {
    Ok(changes_since(pool, options, Checkpoint::default())
        .await?
        .report)
}

async fn changes_since(
    pool: &PgPool,
    options: &AuditOptions,
    base: Checkpoint,
) -> Result<Audit, StoreError> {
    let clock = std::time::Instant::now();
    let mut tx = snapshot(pool).await?;
    let started_at = db_now(&mut tx).await?;
    let mut report = AuditReport {
        kind: AuditKind::Incremental,
        from_position: Some(base.events.upto),
        ..AuditReport::default()
    };
    let (checkpoint, changed) =
        delta::advance(&mut tx, options, &base, started_at, &mut report).await?;
    money::check_open(&mut tx, options, &mut report).await?;
    check_operations(&mut tx, options, false, &mut report).await?;
    tx.rollback().await?;
    // Each order's checks stand alone, so they need not share the SKUs'
    // snapshot: an order that changed again meanwhile is checked as it is now.
    for chunk in changed.chunks(options.chunk.max(1)) {
        let work = std::time::Instant::now();
        let mut tx = snapshot(pool).await?;
        let expected = check_projection(&mut tx, Some(chunk), &mut report).await?;
        delta::check_order_ledgers(&mut tx, chunk, expected, &mut report).await?;
        money::check_orders(&mut tx, Some(chunk), &mut report).await?;
        tx.rollback().await?;
        let pace = options.pace.clamp(0.01, 1.0);
        if pace < 1.0 {
            tokio::time::sleep(work.elapsed().mul_f64(1.0 / pace - 1.0)).await;
        }
    }
    Ok(finished(report, checkpoint, started_at, clock))
}

/// Ends the snapshot: the audit, with where it leaves the next one.
async fn finish(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    report: AuditReport,
    checkpoint: Checkpoint,
    started_at: chrono::DateTime<chrono::Utc>,
    clock: std::time::Instant,
) -> Result<Audit, StoreError> {
    tx.rollback().await?;
    Ok(finished(report, checkpoint, started_at, clock))
}

/// The audit, with where it leaves the next one.
fn finished(
    mut report: AuditReport,
    checkpoint: Checkpoint,
    started_at: chrono::DateTime<chrono::Utc>,
    clock: std::time::Instant,
) -> Audit {
    report.to_position = checkpoint.events.upto;
    Audit {
        report,
        started_at,
        seconds: clock.elapsed().as_secs_f64(),
        checkpoint,
    }
}

async fn snapshot(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

async fn db_now(conn: &mut PgConnection) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(conn).await?)
}
