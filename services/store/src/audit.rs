//! The audit: proves soldonce's invariants from the database alone.
//! - per SKU, `reserved` = units on `payment_pending` orders, `sold` = units
//!   on confirmed orders, and each bucket = its ledger sum;
//! - each order's projection row = the fold of its events;
//! - no order settled by more than one payment; every payment the PSP
//!   reported as succeeded belongs to a confirmed or refunded order;
//! - the outbox backlog and its oldest row's age (reported, and a violation
//!   past `max_outbox_age`).

use crate::StoreError;
use domain::Event;
use futures::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;
use uuid::Uuid;

/// One broken invariant, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub subject: String,
    pub detail: String,
}

/// The audit's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub skus: u64,
    pub orders: u64,
    pub events: u64,
    pub outbox_backlog: i64,
    pub outbox_oldest_seconds: f64,
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// Whether every invariant holds.
    pub fn clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs every check.
pub async fn run(pool: &PgPool, max_outbox_age_secs: f64) -> Result<AuditReport, StoreError> {
    let mut report = AuditReport::default();
    check_stock(pool, &mut report).await?;
    check_projection(pool, &mut report).await?;
    check_payments(pool, &mut report).await?;
    let (backlog, oldest) = crate::outbox::backlog(pool).await?;
    report.outbox_backlog = backlog;
    report.outbox_oldest_seconds = oldest;
    if oldest > max_outbox_age_secs {
        report.violations.push(Violation {
            check: "outbox_lag",
            subject: "outbox".into(),
            detail: format!("{backlog} rows wait, the oldest for {oldest:.0} s"),
        });
    }
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

async fn check_stock(pool: &PgPool, report: &mut AuditReport) -> Result<(), StoreError> {
    let rows: Vec<SkuBooks> = sqlx::query_as(
        "WITH l AS (SELECT sku, sum(d_available)::bigint a, sum(d_reserved)::bigint r, sum(d_sold)::bigint s FROM stock_ledger GROUP BY sku), \
              o AS (SELECT ol.sku, \
                      coalesce(sum(ol.quantity) FILTER (WHERE o.state = 'payment_pending'), 0)::bigint pending, \
                      coalesce(sum(ol.quantity) FILTER (WHERE o.state = 'confirmed'), 0)::bigint confirmed \
                    FROM order_lines ol JOIN orders o ON o.id = ol.order_id GROUP BY ol.sku) \
         SELECT s.sku, s.available, s.reserved, s.sold, coalesce(l.a, 0) AS ledger_available, coalesce(l.r, 0) AS ledger_reserved, \
                coalesce(l.s, 0) AS ledger_sold, coalesce(o.pending, 0) AS pending, coalesce(o.confirmed, 0) AS confirmed \
         FROM stock s LEFT JOIN l ON l.sku = s.sku LEFT JOIN o ON o.sku = s.sku ORDER BY s.sku",
    )
    .fetch_all(pool)
    .await?;
    for SkuBooks { sku, available: a, reserved: r, sold: s, ledger_available: la, ledger_reserved: lr, ledger_sold: ls, pending, confirmed } in rows {
        report.skus += 1;
        let mut flag = |check, detail: String| report.violations.push(Violation { check, subject: sku.clone(), detail });
        if (a, r, s) != (la, lr, ls) {
            flag("ledger_drift", format!("buckets available {a} reserved {r} sold {s}, ledger says {la} / {lr} / {ls}"));
        }
        if r != pending {
            flag("reserved_mismatch", format!("reserved {r}, but payment_pending orders hold {pending}"));
        }
        if s != confirmed {
            flag("sold_mismatch", format!("sold {s}, but confirmed orders hold {confirmed}"));
        }
    }
    Ok(())
}

/// Streams events and projection rows in order id order and compares each
/// order's fold with its row.
async fn check_projection(pool: &PgPool, report: &mut AuditReport) -> Result<(), StoreError> {
    let mut projected: HashMap<Uuid, domain::Order> = HashMap::new();
    let mut rows = crate::orders::stream_all(pool);
    while let Some(order) = rows.next().await {
        let order = order?;
        projected.insert(order.id, order);
    }
    report.orders = projected.len() as u64;
    let mut events = sqlx::query_as::<_, (Uuid, String, serde_json::Value)>(
        "SELECT stream_id, type, data FROM events WHERE type LIKE 'order.%' ORDER BY stream_id, version",
    )
    .fetch(pool);
    let mut current: Option<(Uuid, Option<domain::Order>)> = None;
    let mut finish = |stream: Uuid, folded: Option<domain::Order>, report: &mut AuditReport| {
        let row = projected.remove(&stream);
        if row != folded {
            report.violations.push(Violation {
                check: "projection_drift",
                subject: stream.to_string(),
                detail: format!(
                    "projection says {}, events fold to {}",
                    row.map_or("nothing".into(), |o| format!("{} v{}", o.state, o.version)),
                    folded.map_or("nothing".into(), |o| format!("{} v{}", o.state, o.version))
                ),
            });
        }
    };
    while let Some(row) = events.next().await {
        let (stream, ty, data) = row?;
        report.events += 1;
        let event = Event::from_parts(&ty, data).map_err(|e| StoreError::Corrupt(format!("event of {stream}: {e}")))?;
        match &mut current {
            Some((s, state)) if *s == stream => *state = domain::evolve(state.take(), &event),
            _ => {
                if let Some((s, state)) = current.take() {
                    finish(s, state, report);
                }
                current = Some((stream, domain::evolve(None, &event)));
            }
        }
    }
    if let Some((s, state)) = current.take() {
        finish(s, state, report);
    }
    for (id, row) in projected {
        report.violations.push(Violation {
            check: "projection_drift",
            subject: id.to_string(),
            detail: format!("projection row ({}) has no events", row.state),
        });
    }
    Ok(())
}

async fn check_payments(pool: &PgPool, report: &mut AuditReport) -> Result<(), StoreError> {
    let doubled: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT stream_id, count(DISTINCT data->>'payment_id') FROM events \
         WHERE type IN ('order.confirmed.v1', 'order.refunded.v1') GROUP BY stream_id HAVING count(DISTINCT data->>'payment_id') > 1",
    )
    .fetch_all(pool)
    .await?;
    for (order, n) in doubled {
        report.violations.push(Violation { check: "double_payment", subject: order.to_string(), detail: format!("{n} payments settled it") });
    }
    let orphans: Vec<(String, Option<Uuid>, Option<String>)> = sqlx::query_as(
        "SELECT w.webhook_id, w.order_id, o.state FROM webhook_receipts w LEFT JOIN orders o ON o.id = w.order_id \
         WHERE w.event_type = 'payment.succeeded' AND (o.state IS NULL OR o.state NOT IN ('confirmed', 'refunded'))",
    )
    .fetch_all(pool)
    .await?;
    for (webhook, order, state) in orphans {
        report.violations.push(Violation {
            check: "unsettled_payment",
            subject: order.map_or("unknown order".into(), |o| o.to_string()),
            detail: format!("payment.succeeded ({webhook}) but the order is {}", state.as_deref().unwrap_or("missing")),
        });
    }
    Ok(())
}
