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

use crate::StoreError;
use futures::StreamExt;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use std::time::Duration;
use uuid::Uuid;

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
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            max_outbox_age: Duration::from_secs(300),
            shipment_grace: Duration::from_secs(600),
            compensation_grace: Duration::from_secs(60),
        }
    }
}

/// The audit's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
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

/// Runs every check in one read-only snapshot.
pub async fn run(pool: &PgPool, options: &AuditOptions) -> Result<AuditReport, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let mut report = AuditReport::default();
    check_stock(&mut tx, &mut report).await?;
    check_projection(&mut tx, &mut report).await?;
    crate::audit_money::check(&mut tx, options, &mut report).await?;
    check_operations(&mut tx, options, &mut report).await?;
    tx.rollback().await?;
    Ok(report)
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

async fn check_stock(conn: &mut PgConnection, report: &mut AuditReport) -> Result<(), StoreError> {
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
    Ok(())
}

/// Streams each projection row beside its events, folds and compares, one
/// order at a time; then names event streams that have no row.
async fn check_projection(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let describe = |o: &Option<domain::Order>| {
        o.as_ref()
            .map_or("nothing".into(), |o| format!("{} v{}", o.state, o.version))
    };
    {
        let mut rows = crate::orders::stream_with_history(&mut *conn);
        while let Some(row) = rows.next().await {
            let (row, events) = row?;
            report.orders += 1;
            report.events += events.len() as u64;
            let folded = domain::fold(&events);
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
    let orphans: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT e.stream_id, count(*) FROM events e WHERE e.type LIKE 'order.%' \
         AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = e.stream_id) GROUP BY e.stream_id LIMIT 1000",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (stream, n) in orphans {
        report.events += u64::try_from(n).unwrap_or(0);
        report.flag(
            "projection_drift",
            stream.to_string(),
            format!("{n} events but no projection row"),
        );
    }
    Ok(())
}

async fn check_operations(
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
    let dead: Vec<(String, i64)> = sqlx::query_as(
        "SELECT consumer, count(*) FROM dead_letters GROUP BY consumer ORDER BY consumer",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (consumer, n) in dead {
        report.flag(
            "dead_letters",
            consumer,
            format!("{n} messages could not be handled (see the dead_letters table)"),
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
            format!("{n} events could not be published (see the outbox_parked table)"),
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
