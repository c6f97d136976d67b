//! The audit: proves soldonce's invariants from the database, read in one
//! REPEATABLE READ snapshot (so live traffic never shows as a violation) and
//! streamed (memory stays flat however many orders there are).
//! - per SKU, `reserved` = units on `payment_pending` orders, `sold` = units
//!   on confirmed orders, and each bucket = its ledger sum;
//! - each order's projection row = the fold of its events;
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
//! (`audit_delta`): it checks only the orders with events the last recorded
//! run had not seen, and each SKU's buckets against that run's ledger sums
//! plus the ledger rows added since, so its snapshot is short however many
//! orders there are; it falls back to a full pass when none was recorded or
//! the last is older than `full_every`. Runs are recorded (`audit_runs`), so
//! the console shows the last one instead of running its own.

use crate::audit_delta::{Checkpoint, LineKey};
use crate::StoreError;
use futures::StreamExt;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use std::time::Duration;
use uuid::Uuid;

pub use crate::audit_runs::{last, RecordedAudit};

/// Most violations listed one by one; the rest are only counted.
pub const MAX_LISTED: usize = 1000;

/// One broken invariant, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub subject: String,
    pub detail: String,
}

/// How patient the audit is with work still in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditOptions {
    /// Outbox rows older than this are a violation.
    pub max_outbox_age: Duration,
    /// Confirmed orders without a shipment for longer than this are a violation.
    pub shipment_grace: Duration,
    /// Decided refunds not carried out for longer than this are a violation.
    pub compensation_grace: Duration,
    /// [`incremental`] makes a full pass when the last recorded one is older.
    pub full_every: Duration,
    /// A sequence number an audit did not see (a transaction in flight, or
    /// rolled back) is looked for again this long, then taken for a rollback.
    pub hole_patience: Duration,
    /// [`incremental`] checks the changed orders this many at a time, each
    /// group in a snapshot of its own (short snapshots hold back no vacuum).
    pub chunk: usize,
    /// The share of its time [`incremental`] spends working, in (0, 1]:
    /// after each group it rests `work × (1 / pace − 1)`, as autovacuum's
    /// cost delay does, so a periodic audit never takes more than its share
    /// of the machine from a flash sale (it lags, and catches up after).
    pub pace: f64,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            max_outbox_age: Duration::from_secs(300),
            shipment_grace: Duration::from_secs(600),
            compensation_grace: Duration::from_secs(60),
            full_every: Duration::from_secs(3600),
            hole_patience: Duration::from_secs(600),
            chunk: 2000,
            pace: 1.0,
        }
    }
}

/// A full pass, or the orders and ledger rows that changed since the last
/// recorded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditKind {
    #[default]
    Full,
    Incremental,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Full => "full",
            AuditKind::Incremental => "incremental",
        }
    }
}

/// The audit's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub kind: AuditKind,
    /// Incremental: the orders checked are those with events past this position.
    pub from_position: Option<i64>,
    /// The highest event position the audit's snapshot held.
    pub to_position: i64,
    pub skus: u64,
    pub orders: u64,
    pub events: u64,
    pub payments: u64,
    pub outbox_backlog: i64,
    pub outbox_oldest_seconds: f64,
    /// Every violation found; at most [`MAX_LISTED`] are in `violations`.
    pub violation_count: u64,
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// Whether every invariant holds.
    pub fn clean(&self) -> bool {
        self.violation_count == 0
    }

    /// Records a violation (listed while fewer than [`MAX_LISTED`] are).
    pub fn flag(
        &mut self,
        check: &'static str,
        subject: impl Into<String>,
        detail: impl Into<String>,
    ) {
        self.violation_count += 1;
        if self.violations.len() < MAX_LISTED {
            self.violations.push(Violation {
                check,
                subject: subject.into(),
                detail: detail.into(),
            });
        }
    }
}

/// An audit done, to be [recorded](Audit::record).
#[derive(Debug)]
pub struct Audit {
    pub report: AuditReport,
    pub(crate) started_at: chrono::DateTime<chrono::Utc>,
    pub(crate) seconds: f64,
    /// Where this run leaves the next incremental one.
    pub(crate) checkpoint: Checkpoint,
}

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
    crate::audit_money::check(&mut tx, options, None, &mut report).await?;
    check_operations(&mut tx, options, true, &mut report).await?;
    let checkpoint = crate::audit_delta::of_full_pass(&mut tx, options, sums).await?;
    finish(tx, report, checkpoint, started_at, clock).await
}

/// The changes since the last recorded run's checkpoint, or a full pass
/// when there is none or the last full pass is older than `full_every`.
pub async fn incremental(pool: &PgPool, options: &AuditOptions) -> Result<Audit, StoreError> {
    let due = crate::audit_runs::full_pass_due(pool, options.full_every).await?;
    let base = if due {
        None
    } else {
        crate::audit_delta::load(pool).await?
    };
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
        crate::audit_delta::advance(&mut tx, options, &base, started_at, &mut report).await?;
    crate::audit_money::check_open(&mut tx, options, &mut report).await?;
    check_operations(&mut tx, options, false, &mut report).await?;
    tx.rollback().await?;
    // Each order's checks stand alone, so they need not share the SKUs'
    // snapshot: an order that changed again meanwhile is checked as it is now.
    for chunk in changed.chunks(options.chunk.max(1)) {
        let work = std::time::Instant::now();
        let mut tx = snapshot(pool).await?;
        let expected = check_projection(&mut tx, Some(chunk), &mut report).await?;
        crate::audit_delta::check_order_ledgers(&mut tx, chunk, expected, &mut report).await?;
        crate::audit_money::check_orders(&mut tx, Some(chunk), &mut report).await?;
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

/// One SKU's buckets beside its ledger sums and the units its orders hold.
#[derive(sqlx::FromRow)]
struct SkuBooks {
    sku: String,
    available: i64,
    reserved: i64,
    sold: i64,
    ledger_available: i64,
    ledger_reserved: i64,
    ledger_sold: i64,
    pending: i64,
    confirmed: i64,
}

/// Returns each SKU's ledger sums (available, reserved, sold) for the checkpoint.
async fn check_stock(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<BTreeMap<String, [i64; 3]>, StoreError> {
    let mut rows = sqlx::query_as::<_, SkuBooks>(
        "WITH l AS (SELECT sku, sum(d_available)::bigint a, sum(d_reserved)::bigint r, sum(d_sold)::bigint s FROM stock_ledger GROUP BY sku), \
              o AS (SELECT ol.sku, \
                      coalesce(sum(ol.quantity) FILTER (WHERE o.state = 'payment_pending'), 0)::bigint pending, \
                      coalesce(sum(ol.quantity) FILTER (WHERE o.state = 'confirmed'), 0)::bigint confirmed \
                    FROM order_lines ol JOIN orders o ON o.id = ol.order_id GROUP BY ol.sku) \
         SELECT s.sku, s.available, s.reserved, s.sold, coalesce(l.a, 0) AS ledger_available, coalesce(l.r, 0) AS ledger_reserved, \
                coalesce(l.s, 0) AS ledger_sold, coalesce(o.pending, 0) AS pending, coalesce(o.confirmed, 0) AS confirmed \
         FROM stock s LEFT JOIN l ON l.sku = s.sku LEFT JOIN o ON o.sku = s.sku ORDER BY s.sku",
    )
    .fetch(&mut *conn);
    let mut flags = vec![];
    let mut sums = BTreeMap::new();
    while let Some(row) = rows.next().await {
        let SkuBooks {
            sku,
            available: a,
            reserved: r,
            sold: s,
            ledger_available: la,
            ledger_reserved: lr,
            ledger_sold: ls,
            pending,
            confirmed,
        } = row?;
        report.skus += 1;
        sums.insert(sku.clone(), [la, lr, ls]);
        if (a, r, s) != (la, lr, ls) {
            flags.push((
                "ledger_drift",
                sku.clone(),
                format!(
                    "buckets available {a} reserved {r} sold {s}, ledger says {la} / {lr} / {ls}"
                ),
            ));
        }
        if r != pending {
            flags.push((
                "reserved_mismatch",
                sku.clone(),
                format!("reserved {r}, but payment_pending orders hold {pending}"),
            ));
        }
        if s != confirmed {
            flags.push((
                "sold_mismatch",
                sku,
                format!("sold {s}, but confirmed orders hold {confirmed}"),
            ));
        }
    }
    drop(rows);
    for (check, subject, detail) in flags {
        report.flag(check, subject, detail);
    }
    Ok(sums)
}

/// Streams each projection row (of `only`, or all) beside its events, folds
/// and compares, one order at a time; then names event streams that have no
/// row. With `only`, returns the stock each order's events moved, per line.
async fn check_projection(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<BTreeMap<LineKey, [i64; 3]>, StoreError> {
    let describe = |o: &Option<domain::Order>| {
        o.as_ref()
            .map_or("nothing".into(), |o| format!("{} v{}", o.state, o.version))
    };
    let mut moved = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    {
        let mut rows = crate::orders::stream_with_history(&mut *conn, only);
        while let Some(row) = rows.next().await {
            let (row, events) = row?;
            report.orders += 1;
            report.events += events.len() as u64;
            let folded = domain::fold(&events);
            if only.is_some() {
                seen.insert(row.id);
                crate::audit_delta::movements(row.id, &events, folded.as_ref(), &mut moved);
            }
            let row = Some(row);
            if row != folded {
                let subject = row.as_ref().map(|o| o.id.to_string()).unwrap_or_default();
                let detail = format!(
                    "projection says {}, events fold to {}",
                    describe(&row),
                    describe(&folded)
                );
                report.flag("projection_drift", subject, detail);
            }
        }
    }
    let orphans: Vec<(Uuid, i64)> = match only {
        None => sqlx::query_as(
            "SELECT e.stream_id, count(*) FROM events e WHERE e.type LIKE 'order.%' \
             AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = e.stream_id) GROUP BY e.stream_id LIMIT 1000",
        )
        .fetch_all(&mut *conn)
        .await?,
        Some(ids) => {
            let unseen: Vec<Uuid> = ids.iter().filter(|id| !seen.contains(*id)).copied().collect();
            sqlx::query_as(
                "SELECT e.stream_id, count(*) FROM events e WHERE e.stream_id = ANY($1) \
                 GROUP BY e.stream_id LIMIT 1000",
            )
            .bind(unseen)
            .fetch_all(&mut *conn)
            .await?
        }
    };
    for (stream, n) in orphans {
        report.events += u64::try_from(n).unwrap_or(0);
        report.flag(
            "projection_drift",
            stream.to_string(),
            format!("{n} events but no projection row"),
        );
    }
    Ok(moved)
}

/// The operational checks; `unshipped` (a scan of every confirmed order)
/// only in a full pass.
///
/// A dead letter that a later fact resolved no longer counts: an
/// `order.placed` the payment worker gave up on whose order has since left
/// `payment_pending` (a slow payment that then succeeded, learned by webhook
/// or reconciliation; a decline; an expiry), or an `order.confirmed`
/// fulfillment gave up on whose order has its shipment.
const DEAD_LETTERS_OUTSTANDING: &str = "\
    WITH letters AS (\
      SELECT consumer, split_part(subject, '.', 3) AS kind, \
             CASE WHEN split_part(subject, '.', 4) ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' \
                  THEN split_part(subject, '.', 4)::uuid END AS order_id \
      FROM dead_letters WHERE redriven_at IS NULL AND subject LIKE 'soldonce.order.%') \
    SELECT consumer, count(*) FROM ( \
      SELECT consumer FROM letters l WHERE NOT ( \
        (l.kind = 'placed' AND EXISTS (SELECT 1 FROM orders o WHERE o.id = l.order_id AND o.state <> 'payment_pending')) \
        OR (l.kind = 'confirmed' AND EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = l.order_id))) \
      UNION ALL \
      SELECT consumer FROM dead_letters WHERE redriven_at IS NULL AND subject NOT LIKE 'soldonce.order.%') d \
    GROUP BY consumer ORDER BY consumer";

async fn check_operations(
    conn: &mut PgConnection,
    options: &AuditOptions,
    full: bool,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    if full {
        check_unshipped(conn, options, report).await?;
    }
    let dead: Vec<(String, i64)> = sqlx::query_as(DEAD_LETTERS_OUTSTANDING)
        .fetch_all(&mut *conn)
        .await?;
    for (consumer, n) in dead {
        report.flag(
            "dead_letters",
            consumer,
            format!("{n} messages could not be handled (soldonce dead-letters list)"),
        );
    }
    let parked: Vec<(String, i64)> = sqlx::query_as(
        "SELECT reason, count(*) FROM outbox_parked GROUP BY reason ORDER BY reason",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (reason, n) in parked {
        report.flag(
            "outbox_parked",
            reason,
            format!("{n} events could not be published (soldonce outbox parked)"),
        );
    }
    let (backlog, oldest): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox",
    )
    .fetch_one(&mut *conn)
    .await?;
    report.outbox_backlog = backlog;
    report.outbox_oldest_seconds = oldest;
    if oldest > options.max_outbox_age.as_secs_f64() {
        report.flag(
            "outbox_lag",
            "outbox",
            format!("{backlog} rows wait, the oldest for {oldest:.0} s"),
        );
    }
    Ok(())
}

async fn check_unshipped(
    conn: &mut PgConnection,
    options: &AuditOptions,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let unshipped: Vec<(Uuid, f64)> = sqlx::query_as(
        "SELECT o.id, extract(epoch FROM now() - o.updated_at)::float8 FROM orders o \
         WHERE o.state = 'confirmed' AND o.updated_at < now() - make_interval(secs => $1) \
         AND NOT EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id) ORDER BY o.updated_at LIMIT 1000",
    )
    .bind(options.shipment_grace.as_secs_f64())
    .fetch_all(&mut *conn)
    .await?;
    for (order, age) in unshipped {
        report.flag(
            "unshipped",
            order.to_string(),
            format!("confirmed {age:.0} s ago and still without a shipment"),
        );
    }
    Ok(())
}
