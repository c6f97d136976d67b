//! Stock buckets and their ledger. Every movement — receipts, adjustments,
//! and what order events cause (`domain::Event::movement`) — goes through
//! [`apply`]: fragments of the write path's one statement that move each
//! SKU once by the sum of its movements (never below zero) and write one
//! ledger row per movement. A batch of several SKUs locks them in SKU order first, so two
//! batches never deadlock.

use crate::statement::Statement;
use crate::StoreError;
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

/// Applies every move, as fragments of `statement`: the statement's
/// `Written::StockShort` names the first SKU (in SKU order) that lacked the
/// units or does not exist. Nothing may then be committed: the caller rolls
/// back. Several SKUs are locked in SKU order first (a sub-statement the
/// move reads, so it runs first, row by row), so two batches never deadlock.
pub(crate) fn apply<'q>(
    statement: &mut Statement<'q>,
    moves: &'q [Move],
) -> Result<(), StoreError> {
    if moves.is_empty() {
        return Ok(());
    }
    let (per_sku, rows) = ledger_rows(moves);
    let (mut ts, mut ta, mut tr, mut tsold) = (vec![], vec![], vec![], vec![]);
    for (sku, d) in &per_sku {
        ts.push(sku.as_str());
        ta.push(d.available);
        tr.push(d.reserved);
        tsold.push(d.sold);
    }
    let several = per_sku.len() > 1;
    let expected: Vec<Sku> = per_sku.into_keys().cloned().collect();
    let st = statement;
    let (ts, ta, tr, tsold) = (st.bind(ts)?, st.bind(ta)?, st.bind(tr)?, st.bind(tsold)?);
    let (skus, names, a, r, s) = (
        st.bind(rows.skus)?,
        st.bind(rows.names)?,
        st.bind(rows.a)?,
        st.bind(rows.r)?,
        st.bind(rows.s)?,
    );
    let (orders, reasons) = (st.bind(rows.orders)?, st.bind(rows.reasons)?);
    let locked = if several {
        st.cte(
            "stock_locked",
            &format!("SELECT sku FROM stock WHERE sku = ANY({ts}::text[]) ORDER BY sku FOR UPDATE"),
        );
        " AND stock.sku IN (SELECT sku FROM stock_locked)"
    } else {
        ""
    };
    st.cte(
        "moved",
        &format!(
            "UPDATE stock SET available = stock.available + d.a, reserved = stock.reserved + d.r, sold = stock.sold + d.s \
             FROM unnest({ts}::text[], {ta}::bigint[], {tr}::bigint[], {tsold}::bigint[]) AS d(sku, a, r, s) \
             WHERE stock.sku = ANY({ts}::text[]) AND stock.sku = d.sku AND stock.available + d.a >= 0 AND stock.reserved + d.r >= 0{locked} \
             RETURNING stock.sku"
        ),
    );
    st.cte(
        "ledger",
        &format!(
            "INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id, reason) \
             SELECT x.sku, x.mv, x.a, x.r, x.s, x.o, x.why \
             FROM unnest({skus}::text[], {names}::text[], {a}::bigint[], {r}::bigint[], {s}::bigint[], {orders}::uuid[], {reasons}::text[]) \
                  AS x(sku, mv, a, r, s, o, why) \
             WHERE x.sku IN (SELECT sku FROM moved)"
        ),
    );
    st.expect_moved("moved", expected);
    Ok(())
}

/// Each move's ledger row, column by column, in the order the insert binds them.
struct LedgerRows<'q> {
    skus: Vec<&'q str>,
    names: Vec<&'static str>,
    a: Vec<i64>,
    r: Vec<i64>,
    s: Vec<i64>,
    orders: Vec<Option<Uuid>>,
    reasons: Vec<Option<&'q str>>,
}

/// Each SKU's movements summed (in SKU order), and each move's ledger row.
fn ledger_rows(moves: &[Move]) -> (BTreeMap<&Sku, domain::Buckets>, LedgerRows<'_>) {
    let mut per_sku: BTreeMap<&Sku, domain::Buckets> = BTreeMap::new();
    let n = moves.len();
    let mut rows = LedgerRows {
        skus: Vec::with_capacity(n),
        names: Vec::with_capacity(n),
        a: Vec::with_capacity(n),
        r: Vec::with_capacity(n),
        s: Vec::with_capacity(n),
        orders: Vec::with_capacity(n),
        reasons: Vec::with_capacity(n),
    };
    for m in moves {
        let d = m.movement.delta(m.units);
        let sum = per_sku.entry(&m.sku).or_default();
        sum.available += d.available;
        sum.reserved += d.reserved;
        sum.sold += d.sold;
        rows.skus.push(m.sku.as_str());
        rows.names.push(m.movement.ledger_name());
        rows.a.push(d.available);
        rows.r.push(d.reserved);
        rows.s.push(d.sold);
        rows.orders.push(m.order_id);
        rows.reasons.push(m.reason.as_deref());
    }
    (per_sku, rows)
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
