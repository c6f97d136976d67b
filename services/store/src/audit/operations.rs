//! The audit's operational checks: confirmed orders shipped in time, no
//! dead letters outstanding, nothing parked, the outbox drained.

use super::report::{AuditOptions, AuditReport};
use crate::StoreError;
use sqlx::PgConnection;
use uuid::Uuid;

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

pub(super) async fn check_operations(
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
    let (backlog, oldest): (i64, f64) = sqlx::query_as(&format!(
        "SELECT {}, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox",
        crate::outbox::EVENTS_WAITING
    ))
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
