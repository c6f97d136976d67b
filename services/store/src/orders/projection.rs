//! The orders projection's SQL: rows with their lines inserted, and rows
//! updated fenced on their version, as fragments of the write path's one
//! statement.

use crate::statement::Statement;
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::Order;
use sqlx::PgConnection;
use uuid::Uuid;

/// Inserts new orders' projection rows with their lines, in one statement
/// of their own (a rebuild, a replay).
pub(crate) async fn insert_projections(
    conn: &mut PgConnection,
    orders: &[Order],
) -> Result<(), StoreError> {
    let mut statement = Statement::new();
    insert_projections_into(&mut statement, orders)?;
    statement.run(conn).await.map(|_| ())
}

/// Inserts new orders' projection rows with their lines, as fragments of
/// `statement`; an id already taken is `StoreError::Conflict`.
pub(crate) fn insert_projections_into<'q>(
    statement: &mut Statement<'q>,
    orders: &'q [Order],
) -> Result<(), StoreError> {
    let Some(first) = orders.first() else {
        return Ok(());
    };
    let n = orders.len();
    let rows = NewRows::of(orders)?;
    let lines = rows.line_orders.len();
    let s = statement;
    let (ids, accounts, states) = (
        s.bind(rows.ids)?,
        s.bind(rows.accounts)?,
        s.bind(rows.states)?,
    );
    let (currencies, totals, shippings) = (
        s.bind(rows.currencies)?,
        s.bind(rows.totals)?,
        s.bind(rows.shippings)?,
    );
    let (payment_ids, paid, versions) = (
        s.bind(rows.payment_ids)?,
        s.bind(rows.paid)?,
        s.bind(rows.versions)?,
    );
    let (expires, created, updated) = (
        s.bind(rows.expires)?,
        s.bind(rows.created)?,
        s.bind(rows.updated)?,
    );
    let (refunds, captures, asked) = (
        s.bind(rows.refunds)?,
        s.bind(rows.captures)?,
        s.bind(rows.asked)?,
    );
    let actions = s.bind(rows.actions)?;
    let disputes = s.bind(rows.disputes)?;
    let (line_orders, skus) = (s.bind(rows.line_orders)?, s.bind(rows.skus)?);
    let (quantities, prices) = (s.bind(rows.quantities)?, s.bind(rows.prices)?);
    s.cte(
        "placed",
        &format!(
            "INSERT INTO orders (id, account_id, state, currency, total_minor, shipping, payment_id, paid_minor, version, expires_at, created_at, updated_at, refunds, capture, operator_refunds, next_action, disputes) \
             SELECT * FROM unnest({ids}::uuid[], {accounts}::uuid[], {states}::text[], {currencies}::text[], {totals}::bigint[], {shippings}::jsonb[], {payment_ids}::text[], {paid}::bigint[], {versions}::int[], {expires}::timestamptz[], {created}::timestamptz[], {updated}::timestamptz[], {refunds}::jsonb[], {captures}::text[], {asked}::jsonb[], {actions}::jsonb[], {disputes}::jsonb[]) \
             RETURNING 1"
        ),
    );
    s.cte(
        "placed_lines",
        &format!(
            "INSERT INTO order_lines (order_id, sku, quantity, unit_price_minor) \
             SELECT * FROM unnest({line_orders}::uuid[], {skus}::text[], {quantities}::bigint[], {prices}::bigint[]) \
             RETURNING 1"
        ),
    );
    s.expect_rows("placed", n, first.id);
    s.on_taken("orders_pkey", first.id);
    s.expect_rows("placed_lines", lines, first.id);
    Ok(())
}

/// New orders' projection rows and their lines, column by column, in the
/// order the inserts bind them.
struct NewRows<'q> {
    ids: Vec<Uuid>,
    accounts: Vec<Uuid>,
    states: Vec<&'static str>,
    currencies: Vec<&'q str>,
    totals: Vec<i64>,
    shippings: Vec<Option<serde_json::Value>>,
    payment_ids: Vec<Option<&'q str>>,
    paid: Vec<Option<i64>>,
    versions: Vec<i32>,
    expires: Vec<DateTime<Utc>>,
    created: Vec<DateTime<Utc>>,
    updated: Vec<DateTime<Utc>>,
    refunds: Vec<serde_json::Value>,
    captures: Vec<Option<&'static str>>,
    asked: Vec<serde_json::Value>,
    actions: Vec<Option<serde_json::Value>>,
    disputes: Vec<serde_json::Value>,
    line_orders: Vec<Uuid>,
    skus: Vec<&'q str>,
    quantities: Vec<i64>,
    prices: Vec<i64>,
}

impl<'q> NewRows<'q> {
    /// The rows of `orders`; a field that does not serialise is corrupt.
    fn of(orders: &'q [Order]) -> Result<Self, StoreError> {
        let n = orders.len();
        let mut rows = NewRows {
            ids: Vec::with_capacity(n),
            accounts: Vec::with_capacity(n),
            states: Vec::with_capacity(n),
            currencies: Vec::with_capacity(n),
            totals: Vec::with_capacity(n),
            shippings: Vec::with_capacity(n),
            payment_ids: Vec::with_capacity(n),
            paid: Vec::with_capacity(n),
            versions: Vec::with_capacity(n),
            expires: Vec::with_capacity(n),
            created: Vec::with_capacity(n),
            updated: Vec::with_capacity(n),
            refunds: Vec::with_capacity(n),
            captures: Vec::with_capacity(n),
            asked: Vec::with_capacity(n),
            actions: Vec::with_capacity(n),
            disputes: Vec::with_capacity(n),
            line_orders: vec![],
            skus: vec![],
            quantities: vec![],
            prices: vec![],
        };
        for o in orders {
            rows.push(o)?;
        }
        Ok(rows)
    }

    /// Adds one order's row and its lines' rows.
    fn push(&mut self, o: &'q Order) -> Result<(), StoreError> {
        let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
        self.ids.push(o.id);
        self.accounts.push(o.account_id);
        self.states.push(o.state.as_str());
        self.currencies.push(o.currency.as_str());
        self.totals.push(o.total_minor);
        self.shippings.push(
            o.shipping
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(corrupt)?,
        );
        self.payment_ids
            .push(o.payment.as_ref().map(|p| p.payment_id.as_str()));
        self.paid.push(o.payment.as_ref().map(|p| p.amount_minor));
        self.versions.push(o.version);
        self.expires.push(o.expires_at);
        self.created.push(o.created_at);
        self.updated.push(o.updated_at);
        self.refunds
            .push(serde_json::to_value(&o.refunds).map_err(corrupt)?);
        self.captures
            .push(o.payment.as_ref().and_then(|p| p.capture.column()));
        self.asked
            .push(serde_json::to_value(&o.operator_refunds).map_err(corrupt)?);
        self.actions.push(
            o.next_action
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(corrupt)?,
        );
        self.disputes
            .push(serde_json::to_value(&o.disputes).map_err(corrupt)?);
        for l in &o.lines {
            self.line_orders.push(o.id);
            self.skus.push(l.sku.as_str());
            self.quantities.push(l.quantity.get());
            self.prices.push(l.unit_price_minor);
        }
        Ok(())
    }
}

/// Updates existing orders' projection rows, as a fragment of `statement`,
/// each fenced on the version it had: a concurrent writer is
/// `StoreError::Conflict`.
pub(crate) fn update_projections<'q>(
    statement: &mut Statement<'q>,
    orders: &'q [(i32, Order)],
) -> Result<(), StoreError> {
    let Some((_, first)) = orders.first() else {
        return Ok(());
    };
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let n = orders.len();
    let (mut ids, mut states, mut payment_ids, mut paid) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut versions, mut times, mut refunds, mut before) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut captures, mut asked) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut actions, mut expires) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut disputes = Vec::with_capacity(n);
    for (version_before, o) in orders {
        ids.push(o.id);
        states.push(o.state.as_str());
        payment_ids.push(o.payment.as_ref().map(|p| p.payment_id.as_str()));
        paid.push(o.payment.as_ref().map(|p| p.amount_minor));
        versions.push(o.version);
        times.push(o.updated_at);
        refunds.push(serde_json::to_value(&o.refunds).map_err(corrupt)?);
        captures.push(o.payment.as_ref().and_then(|p| p.capture.column()));
        asked.push(serde_json::to_value(&o.operator_refunds).map_err(corrupt)?);
        actions.push(
            o.next_action
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(corrupt)?,
        );
        expires.push(o.expires_at);
        disputes.push(serde_json::to_value(&o.disputes).map_err(corrupt)?);
        before.push(*version_before);
    }
    let s = statement;
    let (ids, states, payment_ids) = (s.bind(ids)?, s.bind(states)?, s.bind(payment_ids)?);
    let (paid, versions, times) = (s.bind(paid)?, s.bind(versions)?, s.bind(times)?);
    let (refunds, before, captures) = (s.bind(refunds)?, s.bind(before)?, s.bind(captures)?);
    let (asked, actions, expires) = (s.bind(asked)?, s.bind(actions)?, s.bind(expires)?);
    let disputes = s.bind(disputes)?;
    s.cte(
        "updated",
        &format!(
            "UPDATE orders o SET state = x.state, payment_id = x.payment_id, paid_minor = x.paid, \
                    version = x.version, updated_at = x.at, refunds = x.refunds, capture = x.capture, operator_refunds = x.asked, \
                    next_action = x.action, expires_at = x.expires, disputes = x.disputes \
             FROM unnest({ids}::uuid[], {states}::text[], {payment_ids}::text[], {paid}::bigint[], {versions}::int[], {times}::timestamptz[], {refunds}::jsonb[], {before}::int[], {captures}::text[], {asked}::jsonb[], {actions}::jsonb[], {expires}::timestamptz[], {disputes}::jsonb[]) \
                  AS x(id, state, payment_id, paid, version, at, refunds, before, capture, asked, action, expires, disputes) \
             WHERE o.id = ANY({ids}::uuid[]) AND o.id = x.id AND o.version = x.before \
             RETURNING 1"
        ),
    );
    s.expect_rows("updated", n, first.id);
    Ok(())
}
