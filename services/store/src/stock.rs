//! Stock buckets and their ledger. Every movement — receipts, adjustments,
//! and what order events cause (`domain::Event::movement`) — goes through
//! [`apply`]: fragments of the write path's one statement that move each
//! SKU once by the sum of its movements (never below zero) and write one
//! ledger row per movement. A SKU's buckets are two rows (`stock`:
//! available and held; `stock_sold`: sold), read together as the view
//! `stock_buckets` (available, reserved = held − sold, sold). A batch of
//! several SKUs locks them in SKU order first, so two batches never
//! deadlock.

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
/// back.
///
/// A SKU is two rows: `stock` holds its available units and the units its
/// orders hold (`held`: reserved and sold), `stock_sold` the units sold.
/// Checkout moves only the first, a payment's confirmation (reserved →
/// sold) only the second, so the two never wait for each other on a hot
/// SKU's one row; a move that changes both (a late payment's reclaim, an
/// operator's restock) takes the `stock` row first. Several SKUs are
/// locked in SKU order first, every `stock` row before any `stock_sold`
/// row (sub-statements the moves read, so they run first, row by row), so
/// two batches never deadlock.
pub(crate) fn apply<'q>(
    statement: &mut Statement<'q>,
    moves: &'q [Move],
) -> Result<(), StoreError> {
    if moves.is_empty() {
        return Ok(());
    }
    let (per_sku, rows) = ledger_rows(moves);
    let (units, sold) = split(&per_sku);
    let mut moved = vec![];
    if !units.skus.is_empty() {
        moved.push(move_rows(
            statement,
            units,
            ("units", "stock"),
            "available = stock.available + d.a, held = stock.held + d.b",
            "stock.available + d.a >= 0 AND stock.held + d.b >= 0",
        )?);
    }
    if !sold.skus.is_empty() {
        moved.push(move_rows(
            statement,
            sold,
            ("sold", "stock_sold"),
            "sold = stock_sold.sold + d.a",
            "stock_sold.sold + d.a >= 0",
        )?);
    }
    let st = statement;
    let (skus, names, a, r, s) = (
        st.bind(rows.skus)?,
        st.bind(rows.names)?,
        st.bind(rows.a)?,
        st.bind(rows.r)?,
        st.bind(rows.s)?,
    );
    let (orders, reasons) = (st.bind(rows.orders)?, st.bind(rows.reasons)?);
    let moved = moved
        .iter()
        .map(|m| format!("SELECT sku FROM {m}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    st.cte(
        "ledger",
        &format!(
            "INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id, reason) \
             SELECT x.sku, x.mv, x.a, x.r, x.s, x.o, x.why \
             FROM unnest({skus}::text[], {names}::text[], {a}::bigint[], {r}::bigint[], {s}::bigint[], {orders}::uuid[], {reasons}::text[]) \
                  AS x(sku, mv, a, r, s, o, why) \
             WHERE x.sku IN ({moved})"
        ),
    );
    Ok(())
}

/// Each SKU's summed movements as the rows they move: `stock` (available,
/// held = reserved + sold) where either changes, `stock_sold` where sold
/// changes. Every SKU is moved in one row at least, by nothing if its
/// moves cancel out, so that it is known to exist and its ledger rows are
/// written; that row is `stock_sold`, never the row checkout moves.
fn split<'q>(per_sku: &BTreeMap<&'q Sku, domain::Buckets>) -> (Rows<'q>, Rows<'q>) {
    let (mut units, mut sold) = (Rows::default(), Rows::default());
    for (sku, d) in per_sku {
        let held = d.reserved + d.sold;
        let moves_units = d.available != 0 || held != 0;
        if moves_units {
            units.push(sku, d.available, held);
        }
        if d.sold != 0 || !moves_units {
            sold.push(sku, d.sold, 0);
        }
    }
    (units, sold)
}

/// The SKUs (in SKU order) of one table's rows to move, with two deltas each.
#[derive(Default)]
struct Rows<'q> {
    skus: Vec<&'q Sku>,
    a: Vec<i64>,
    b: Vec<i64>,
}

impl<'q> Rows<'q> {
    fn push(&mut self, sku: &'q Sku, a: i64, b: i64) {
        self.skus.push(sku);
        self.a.push(a);
        self.b.push(b);
    }
}

/// Moves `rows` of `table` (`stock` or `stock_sold`, keyed by `sku`) by
/// `set`, only where `guard` holds (`d.a`, `d.b`: the deltas), as the
/// fragment `<name>_moved` (returned), expected to move every SKU; more
/// than one SKU is locked in SKU order first.
fn move_rows<'q>(
    st: &mut Statement<'q>,
    rows: Rows<'q>,
    (name, table): (&str, &str),
    set: &str,
    guard: &str,
) -> Result<String, StoreError> {
    let expected: Vec<Sku> = rows.skus.iter().map(|s| (*s).clone()).collect();
    let fragment = format!("{name}_moved");
    let several = rows.skus.len() > 1;
    let skus: Vec<&str> = rows.skus.iter().map(|s| s.as_str()).collect();
    let (ts, ta, tb) = (st.bind(skus)?, st.bind(rows.a)?, st.bind(rows.b)?);
    let locked = if several {
        st.cte(
            &format!("{name}_locked"),
            &format!(
                "SELECT sku FROM {table} WHERE sku = ANY({ts}::text[]) ORDER BY sku FOR UPDATE"
            ),
        );
        format!(" AND {table}.sku IN (SELECT sku FROM {name}_locked)")
    } else {
        String::new()
    };
    st.cte(
        &fragment,
        &format!(
            "UPDATE {table} SET {set} \
             FROM unnest({ts}::text[], {ta}::bigint[], {tb}::bigint[]) AS d(sku, a, b) \
             WHERE {table}.sku = ANY({ts}::text[]) AND {table}.sku = d.sku AND {guard}{locked} \
             RETURNING {table}.sku"
        ),
    );
    st.expect_moved(&fragment, expected);
    Ok(fragment)
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

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Movement::*;

    /// The `stock` rows moved: SKU, available, held.
    type UnitRows = Vec<(String, i64, i64)>;

    /// The rows each movement moves, by SKU: (stock's, stock_sold's).
    fn rows_of(moves: &[(&str, domain::Movement, i64)]) -> (UnitRows, Vec<(String, i64)>) {
        let moves: Vec<Move> = moves
            .iter()
            .map(|(sku, movement, units)| Move {
                sku: Sku::parse(sku).expect("sku"),
                movement: *movement,
                units: *units,
                order_id: None,
                reason: None,
            })
            .collect();
        let (per_sku, _) = ledger_rows(&moves);
        let (units, sold) = split(&per_sku);
        let named = |r: &Rows<'_>, i: usize| r.skus[i].to_string();
        (
            (0..units.skus.len())
                .map(|i| (named(&units, i), units.a[i], units.b[i]))
                .collect(),
            (0..sold.skus.len())
                .map(|i| (named(&sold, i), sold.a[i]))
                .collect(),
        )
    }

    #[test]
    fn a_confirmation_moves_only_the_sold_row_and_checkout_only_the_stock_row() {
        assert_eq!(
            rows_of(&[("A", Confirm, 2)]),
            (vec![], vec![("A".into(), 2)])
        );
        assert_eq!(
            rows_of(&[("A", Reserve, 2)]),
            (vec![("A".into(), -2, 2)], vec![])
        );
        assert_eq!(
            rows_of(&[("A", Release, 1)]),
            (vec![("A".into(), 1, -1)], vec![])
        );
    }

    #[test]
    fn a_reclaim_or_a_restock_moves_both_rows() {
        assert_eq!(
            rows_of(&[("A", Reclaim, 1)]),
            (vec![("A".into(), -1, 1)], vec![("A".into(), 1)])
        );
        assert_eq!(
            rows_of(&[("A", Restock, 1)]),
            (vec![("A".into(), 1, -1)], vec![("A".into(), -1)])
        );
    }

    #[test]
    fn moves_that_cancel_out_still_move_the_sold_row_by_nothing() {
        assert_eq!(
            rows_of(&[("A", Reserve, 1), ("A", Release, 1), ("B", Confirm, 1)]),
            (vec![], vec![("A".into(), 0), ("B".into(), 1)])
        );
    }
}
