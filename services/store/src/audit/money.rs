//! The audit's money checks, in the audit's snapshot: every payment soldonce
//! knows of is attached to exactly one confirmed order (or one an operator
//! cancelled, its money given back by an operator refund) or refunded, and the
//! last reconciliation against the PSP's own books found nothing it could
//! not repair.

use super::report::{AuditOptions, AuditReport};
use crate::StoreError;
use sqlx::PgConnection;
use uuid::Uuid;

/// A compensation not carried out: payment, order, refund state, reason, age in seconds, last error.
type Overdue = (
    String,
    Option<Uuid>,
    String,
    Option<String>,
    f64,
    Option<String>,
);

/// A capture not carried out: payment, order, capture state, age in seconds, last error.
type OverdueCapture = (String, Option<Uuid>, String, f64, Option<String>);
/// An operator refund not carried out: order, key, state, age in seconds, last error.
type OverdueAsk = (Uuid, String, String, f64, Option<String>);

/// Every check over every order, or (with `only`) over those orders and
/// their payments; open compensations and reconciliation findings are
/// always checked whole (both are read by index).
pub(crate) async fn check(
    conn: &mut PgConnection,
    options: &AuditOptions,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    check_orders(conn, only, report).await?;
    check_open(conn, options, report).await
}

/// The checks of each order and its payments (of `only`, or all).
pub(crate) async fn check_orders(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    report.payments += count_payments(conn, only).await?;
    check_confirmed_twice(conn, only, report).await?;
    check_unattached(conn, only, report).await?;
    check_unsettled(conn, only, report).await?;
    check_unrecorded_refunds(conn, only, report).await
}

/// The condition limiting a query to the orders `only` names (in `$1`) by
/// `column`; with no `only`, `$1` is NULL and every order counts.
fn scope(only: Option<&[Uuid]>, column: &str) -> String {
    match only {
        Some(_) => format!(" AND {column} = ANY($1)"),
        None => " AND $1::uuid[] IS NULL".to_owned(),
    }
}

/// The payments recorded (of `only`'s orders, or all).
async fn count_payments(conn: &mut PgConnection, only: Option<&[Uuid]>) -> Result<u64, StoreError> {
    Ok(u64::try_from(
        sqlx::query_scalar::<_, i64>(&format!(
            "SELECT count(*) FROM payments WHERE true{}",
            scope(only, "order_id")
        ))
        .bind(only)
        .fetch_one(&mut *conn)
        .await?,
    )
    .unwrap_or(0))
}

/// Flags each order confirmed more than once (`double_payment`).
async fn check_confirmed_twice(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let twice: Vec<(Uuid, i64)> = sqlx::query_as(&format!(
        "SELECT stream_id, count(*) FROM events WHERE type = 'order.confirmed.v1'{} GROUP BY stream_id HAVING count(*) > 1 LIMIT 1000",
        scope(only, "stream_id")
    ))
    .bind(only)
    .fetch_all(&mut *conn)
    .await?;
    for (order, n) in twice {
        report.flag(
            "double_payment",
            order.to_string(),
            format!("confirmed {n} times"),
        );
    }
    Ok(())
}

/// Flags each confirmed order whose payment is not attached to it
/// (`payment_unattached`).
async fn check_unattached(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let unattached: Vec<(Uuid, Option<String>)> = sqlx::query_as(&format!(
        "SELECT o.id, o.payment_id FROM orders o WHERE o.state = 'confirmed'{} AND NOT EXISTS \
         (SELECT 1 FROM payments p WHERE p.payment_id = o.payment_id AND p.order_id = o.id AND p.disposition = 'attached') LIMIT 1000",
        scope(only, "o.id")
    ))
    .bind(only)
    .fetch_all(&mut *conn)
    .await?;
    for (order, payment) in unattached {
        report.flag(
            "payment_unattached",
            order.to_string(),
            format!(
                "confirmed on payment {}, which is not attached to it",
                payment.unwrap_or_default()
            ),
        );
    }
    Ok(())
}

/// Flags each attached payment whose order does not stand on it
/// (`unsettled_payment`), but for one an operator cancelled.
async fn check_unsettled(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let unsettled: Vec<(String, Option<Uuid>, Option<String>)> = sqlx::query_as(&format!(
        "SELECT p.payment_id, p.order_id, o.state FROM payments p LEFT JOIN orders o ON o.id = p.order_id \
         WHERE p.disposition = 'attached'{} AND (o.state IS DISTINCT FROM 'confirmed' OR o.payment_id IS DISTINCT FROM p.payment_id) \
         AND NOT (o.state = 'cancelled' AND o.payment_id = p.payment_id AND EXISTS \
                  (SELECT 1 FROM events e WHERE e.stream_id = o.id AND e.type = 'order.operator_cancelled.v1')) LIMIT 1000",
        scope(only, "p.order_id")
    ))
    .bind(only)
    .fetch_all(&mut *conn)
    .await?;
    for (payment, order, state) in unsettled {
        let detail = format!(
            "attached to order {}, which is {}",
            order.map(|o| o.to_string()).unwrap_or_default(),
            state.as_deref().unwrap_or("missing")
        );
        report.flag("unsettled_payment", payment, detail);
    }
    Ok(())
}

/// Flags each refund the PSP made that its order does not record
/// (`refund_unrecorded`).
async fn check_unrecorded_refunds(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let unrecorded: Vec<(String, Uuid)> = sqlx::query_as(&format!(
        "SELECT p.payment_id, p.order_id FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.refund_state = 'succeeded'{} \
         AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(o.refunds) r WHERE r->>'payment_id' = p.payment_id AND (r->>'refunded')::boolean) LIMIT 1000",
        scope(only, "o.id")
    ))
    .bind(only)
    .fetch_all(&mut *conn)
    .await?;
    for (payment, order) in unrecorded {
        report.flag(
            "refund_unrecorded",
            payment,
            format!("refunded at the PSP but not on order {order}"),
        );
    }
    Ok(())
}

/// Open compensations and reconciliation findings, always whole (both are
/// read by index).
pub(crate) async fn check_open(
    conn: &mut PgConnection,
    options: &AuditOptions,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let overdue: Vec<Overdue> = sqlx::query_as(
        "SELECT payment_id, order_id, refund_state, reason, extract(epoch FROM now() - recorded_at)::float8, last_error FROM payments \
         WHERE refund_state IN ('pending', 'refused') AND (refund_state = 'refused' OR recorded_at <= now() - make_interval(secs => $1)) \
         ORDER BY recorded_at LIMIT 1000",
    )
    .bind(options.compensation_grace.as_secs_f64())
    .fetch_all(&mut *conn)
    .await?;
    for (payment, order, state, reason, age, error) in overdue {
        let order = order.map_or("no order".into(), |o| format!("order {o}"));
        let why = reason.unwrap_or_default();
        let error = error
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        report.flag(
            "compensation_overdue",
            payment,
            format!("refund ({why}, {order}) {state} for {age:.0} s{error}"),
        );
    }
    let captures: Vec<OverdueCapture> = sqlx::query_as(
        "SELECT payment_id, order_id, capture_state, extract(epoch FROM now() - capture_decided_at)::float8, capture_error FROM payments \
         WHERE capture_state IN ('pending', 'refused') AND (capture_state = 'refused' OR capture_decided_at <= now() - make_interval(secs => $1)) \
         ORDER BY capture_decided_at LIMIT 1000",
    )
    .bind(options.compensation_grace.as_secs_f64())
    .fetch_all(&mut *conn)
    .await?;
    for (payment, order, state, age, error) in captures {
        let order = order.map_or("no order".into(), |o| format!("order {o}"));
        let error = error
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        report.flag(
            "capture_overdue",
            payment,
            format!("capture ({order}, shipped) {state} for {age:.0} s{error}"),
        );
    }
    let asked: Vec<OverdueAsk> = sqlx::query_as(
        "SELECT order_id, key, state, extract(epoch FROM now() - requested_at)::float8, last_error FROM operator_refunds \
         WHERE state IN ('pending', 'refused') AND (state = 'refused' OR requested_at <= now() - make_interval(secs => $1)) \
         ORDER BY requested_at LIMIT 1000",
    )
    .bind(options.compensation_grace.as_secs_f64())
    .fetch_all(&mut *conn)
    .await?;
    for (order, key, state, age, error) in asked {
        let error = error
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        report.flag(
            "operator_refund_overdue",
            order.to_string(),
            format!("refund {key:?} asked by an operator {state} for {age:.0} s{error}"),
        );
    }
    let findings: Vec<(String, String, String)> =
        sqlx::query_as("SELECT kind, subject, detail FROM reconcile_findings WHERE NOT repaired ORDER BY id LIMIT 1000")
            .fetch_all(&mut *conn)
            .await?;
    for (kind, subject, detail) in findings {
        report.flag("reconciliation", subject, format!("{kind}: {detail}"));
    }
    check_findings(conn, report).await
}

/// Every finding not acknowledged, named by its order.
async fn check_findings(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    for (id, kind, order, subject, detail) in crate::findings::open_unacknowledged(conn).await? {
        let order = order.map_or_else(|| subject.clone(), |o| o.to_string());
        report.flag(
            "finding",
            order,
            format!("#{id} {kind} {subject}: {detail} (soldonce findings ack {id} --by NAME)"),
        );
    }
    Ok(())
}
