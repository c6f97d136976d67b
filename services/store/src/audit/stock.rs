//! The audit's stock check: each SKU's buckets against its ledger sums and
//! the units its orders hold.

use super::report::AuditReport;
use crate::StoreError;
use futures::StreamExt;
use sqlx::PgConnection;
use std::collections::BTreeMap;

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
pub(super) async fn check_stock(
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
         FROM stock_buckets s LEFT JOIN l ON l.sku = s.sku LEFT JOIN o ON o.sku = s.sku ORDER BY s.sku",
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
