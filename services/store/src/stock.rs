//! Stock buckets and their ledger. Every movement — receipts, adjustments,
//! and what order events cause (`domain::Event::movement`) — goes through
//! [`apply`]: one statement per batch that moves each SKU once by the sum
//! of its movements (never below zero) and writes one ledger row per
//! movement. A batch of several SKUs locks them in SKU order first, so two
//! batches never deadlock.

use domain::{Movement, Sku};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

/// One movement of one SKU, with what its ledger row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub sku: Sku,
    pub movement: Movement,
    /// Units (signed for `Adjust`).
    pub units: i64,
    pub order_id: Option<Uuid>,
    pub reason: Option<String>,
}

/// Applies every move; returns the first SKU (in SKU order) that lacked the
/// units or does not exist. Nothing may then be committed: the caller rolls
/// back.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    moves: &[Move],
) -> Result<Option<Sku>, sqlx::Error> {
    if moves.is_empty() {
        return Ok(None);
    }
    let mut per_sku: BTreeMap<&Sku, domain::Buckets> = BTreeMap::new();
    let n = moves.len();
    let (mut skus, mut names, mut a, mut r, mut s, mut orders, mut reasons) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for m in moves {
        let d = m.movement.delta(m.units);
        let sum = per_sku.entry(&m.sku).or_default();
        sum.available += d.available;
        sum.reserved += d.reserved;
        sum.sold += d.sold;
        skus.push(m.sku.as_str());
        names.push(m.movement.ledger_name());
        a.push(d.available);
        r.push(d.reserved);
        s.push(d.sold);
        orders.push(m.order_id);
        reasons.push(m.reason.as_deref());
    }
    if per_sku.len() > 1 {
        let keys: Vec<&str> = per_sku.keys().map(|k| k.as_str()).collect();
        sqlx::query("SELECT 1 FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE")
            .bind(&keys)
            .execute(&mut *conn)
            .await?;
    }
    let (mut ts, mut ta, mut tr, mut tsold) = (vec![], vec![], vec![], vec![]);
    for (sku, d) in &per_sku {
        ts.push(sku.as_str());
        ta.push(d.available);
        tr.push(d.reserved);
        tsold.push(d.sold);
    }
    let moved: Vec<String> = sqlx::query_scalar(
        "WITH d AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS d(sku, a, r, s)), \
         m AS (UPDATE stock SET available = stock.available + d.a, reserved = stock.reserved + d.r, sold = stock.sold + d.s \
               FROM d WHERE stock.sku = ANY($1::text[]) AND stock.sku = d.sku AND stock.available + d.a >= 0 AND stock.reserved + d.r >= 0 \
               RETURNING stock.sku), \
         l AS (INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id, reason) \
               SELECT x.sku, x.mv, x.a, x.r, x.s, x.o, x.why \
               FROM unnest($5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::bigint[], $10::uuid[], $11::text[]) \
                    AS x(sku, mv, a, r, s, o, why) \
               WHERE x.sku IN (SELECT sku FROM m)) \
         SELECT sku FROM m",
    )
    .bind(&ts)
    .bind(&ta)
    .bind(&tr)
    .bind(&tsold)
    .bind(&skus)
    .bind(&names)
    .bind(&a)
    .bind(&r)
    .bind(&s)
    .bind(&orders)
    .bind(&reasons)
    .fetch_all(&mut *conn)
    .await?;
    if moved.len() == per_sku.len() {
        return Ok(None);
    }
    Ok(per_sku
        .keys()
        .find(|k| !moved.iter().any(|m| m == k.as_str()))
        .map(|k| (*k).clone()))
}

/// Whether every line's units are available now, the SKUs locked in SKU
/// order until the transaction ends (the fact a late payment's decision
/// needs: `Command::Paid { units_gone }`).
pub(crate) async fn covers(
    conn: &mut PgConnection,
    lines: &[domain::OrderLine],
) -> Result<bool, sqlx::Error> {
    let skus: Vec<&str> = lines.iter().map(|l| l.sku.as_str()).collect();
    let units: Vec<i64> = lines.iter().map(|l| l.quantity.get()).collect();
    let rows: Vec<(bool,)> = sqlx::query_as(
        "SELECT s.available >= w.q FROM stock s \
         JOIN (SELECT sku, sum(q) AS q FROM unnest($1::text[], $2::bigint[]) AS x(sku, q) GROUP BY sku) w ON w.sku = s.sku \
         WHERE s.sku = ANY($1::text[]) ORDER BY s.sku FOR UPDATE OF s",
    )
    .bind(&skus)
    .bind(&units)
    .fetch_all(&mut *conn)
    .await?;
    let distinct = skus.iter().collect::<std::collections::BTreeSet<_>>().len();
    Ok(rows.len() == distinct && rows.iter().all(|(ok,)| *ok))
}
