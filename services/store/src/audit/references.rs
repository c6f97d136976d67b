//! The references the schema no longer checks row by row (migration 40):
//! every order line names an order and a product, every order and stored
//! idempotency key an account, every ledger row a product, every shipment
//! an order. The write path keeps them; this check proves it, in the full
//! pass (a join of each table whole).

use super::report::{AuditReport, MAX_LISTED};
use crate::StoreError;
use sqlx::PgConnection;

/// One reference: the rows of `table` (named by `row`, an expression of
/// its key) whose `column` names no `target`'s `key`; `what` names the
/// target in a violation.
struct Reference {
    table: &'static str,
    column: &'static str,
    row: &'static str,
    target: &'static str,
    key: &'static str,
    what: &'static str,
}

const REFERENCES: [Reference; 6] = [
    Reference {
        table: "order_lines",
        column: "order_id",
        row: "r.order_id || ' ' || r.sku",
        target: "orders",
        key: "id",
        what: "order",
    },
    Reference {
        table: "order_lines",
        column: "sku",
        row: "r.order_id || ' ' || r.sku",
        target: "products",
        key: "sku",
        what: "product",
    },
    Reference {
        table: "orders",
        column: "account_id",
        row: "r.id::text",
        target: "accounts",
        key: "id",
        what: "account",
    },
    Reference {
        table: "idempotency_keys",
        column: "account_id",
        row: "r.account_id || ' ' || r.key",
        target: "accounts",
        key: "id",
        what: "account",
    },
    Reference {
        table: "stock_ledger",
        column: "sku",
        row: "r.id::text",
        target: "products",
        key: "sku",
        what: "product",
    },
    Reference {
        table: "shipments",
        column: "order_id",
        row: "r.id::text",
        target: "orders",
        key: "id",
        what: "order",
    },
];

/// Every reference's breaking rows in one statement (anti-joins on the
/// referenced keys, at most `$1` each): the reference, the row, and what
/// it names.
fn dangling_sql() -> String {
    REFERENCES
        .iter()
        .map(|r| {
            format!(
                "(SELECT '{table}.{column}', {row}, '{what} ' || r.{column} FROM {table} r \
                 WHERE NOT EXISTS (SELECT 1 FROM {target} t WHERE t.{key} = r.{column}) ORDER BY 2 LIMIT $1)",
                table = r.table,
                column = r.column,
                row = r.row,
                what = r.what,
                target = r.target,
                key = r.key,
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Flags each row that names what is not there (`dangling_reference`).
pub(super) async fn check_references(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let dangling: Vec<(String, String, String)> = sqlx::query_as(&dangling_sql())
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
