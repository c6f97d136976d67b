//! The references the schema no longer checks row by row (migration 40):
//! every order line names an order and a product, every order and stored
//! idempotency key an account, every ledger row a product, every shipment
//! an order. The write path keeps them; this check proves it, in the full
//! pass (a join of each table whole).

use super::report::{AuditReport, MAX_LISTED};
use crate::StoreError;
use sqlx::PgConnection;

/// Each reference, as the rows that break it: the reference, the row (its
/// key) and what it names. Anti-joins on the referenced keys.
const DANGLING_SQL: &str = "\
    (SELECT 'order_lines.order_id', l.order_id || ' ' || l.sku, 'order ' || l.order_id \
       FROM order_lines l WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = l.order_id) \
       ORDER BY 2 LIMIT $1) \
    UNION ALL (SELECT 'order_lines.sku', l.order_id || ' ' || l.sku, 'product ' || l.sku \
       FROM order_lines l WHERE NOT EXISTS (SELECT 1 FROM products p WHERE p.sku = l.sku) \
       ORDER BY 2 LIMIT $1) \
    UNION ALL (SELECT 'orders.account_id', o.id::text, 'account ' || o.account_id \
       FROM orders o WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = o.account_id) \
       ORDER BY 2 LIMIT $1) \
    UNION ALL (SELECT 'idempotency_keys.account_id', k.account_id || ' ' || k.key, 'account ' || k.account_id \
       FROM idempotency_keys k WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = k.account_id) \
       ORDER BY 2 LIMIT $1) \
    UNION ALL (SELECT 'stock_ledger.sku', s.id::text, 'product ' || s.sku \
       FROM stock_ledger s WHERE NOT EXISTS (SELECT 1 FROM products p WHERE p.sku = s.sku) \
       ORDER BY 2 LIMIT $1) \
    UNION ALL (SELECT 'shipments.order_id', s.id::text, 'order ' || s.order_id \
       FROM shipments s WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = s.order_id) \
       ORDER BY 2 LIMIT $1)";

/// Flags each row that names what is not there (`dangling_reference`).
pub(super) async fn check_references(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let dangling: Vec<(String, String, String)> = sqlx::query_as(DANGLING_SQL)
        .bind(i64::try_from(MAX_LISTED).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await?;
    for (reference, row, names) in dangling {
        report.flag(
            "dangling_reference",
            row,
            format!("{reference} names {names}, which does not exist"),
        );
    }
    Ok(())
}
