//! The orders projection's SQL: rows with their lines inserted, and rows
//! updated fenced on their version, as fragments of the write path's one
//! statement.

use crate::statement::Statement;
use crate::StoreError;
use domain::Order;
use sqlx::PgConnection;

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
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let n = orders.len();
    let (mut ids, mut accounts, mut states, mut currencies, mut totals) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut shippings, mut payment_ids, mut paid, mut versions, mut expires) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut created, mut updated, mut refunds, mut captures) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut asked, mut actions) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut disputes = Vec::with_capacity(n);
    let (mut line_orders, mut skus, mut quantities, mut prices) = (vec![], vec![], vec![], vec![]);
    for o in orders {
        ids.push(o.id);
        accounts.push(o.account_id);
        states.push(o.state.as_str());
        currencies.push(o.currency.as_str());
        totals.push(o.total_minor);
        shippings.push(
            o.shipping
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(corrupt)?,
        );
        payment_ids.push(o.payment.as_ref().map(|p| p.payment_id.as_str()));
        paid.push(o.payment.as_ref().map(|p| p.amount_minor));
        versions.push(o.version);
        expires.push(o.expires_at);
        created.push(o.created_at);
        updated.push(o.updated_at);
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
        disputes.push(serde_json::to_value(&o.disputes).map_err(corrupt)?);
        for l in &o.lines {
            line_orders.push(o.id);
            skus.push(l.sku.as_str());
            quantities.push(l.quantity.get());
            prices.push(l.unit_price_minor);
        }
    }
    let lines = line_orders.len();
    let s = statement;
    let (ids, accounts, states) = (s.bind(ids)?, s.bind(accounts)?, s.bind(states)?);
    let (currencies, totals, shippings) =
        (s.bind(currencies)?, s.bind(totals)?, s.bind(shippings)?);
    let (payment_ids, paid, versions) = (s.bind(payment_ids)?, s.bind(paid)?, s.bind(versions)?);
    let (expires, created, updated) = (s.bind(expires)?, s.bind(created)?, s.bind(updated)?);
    let (refunds, captures, asked) = (s.bind(refunds)?, s.bind(captures)?, s.bind(asked)?);
    let actions = s.bind(actions)?;
    let disputes = s.bind(disputes)?;
    let (line_orders, skus) = (s.bind(line_orders)?, s.bind(skus)?);
    let (quantities, prices) = (s.bind(quantities)?, s.bind(prices)?);
    s.cte(
        "placed",
        &format!(
            "INSERT INTO orders (id, account_id, state, currency, total_minor, shipping, payment_id, paid_minor, version, expires_at, created_at, updated_at, refunds, capture, operator_refunds, next_action, disputes) \
             SELECT * FROM unnest({ids}::uuid[], {accounts}::uuid[], {states}::text[], {currencies}::text[], {totals}::bigint[], {shippings}::jsonb[], {payment_ids}::text[], {paid}::bigint[], {versions}::int[], {expires}::timestamptz[], {created}::timestamptz[], {updated}::timestamptz[], {refunds}::jsonb[], {captures}::text[], {asked}::jsonb[], {actions}::jsonb[], {disputes}::jsonb[]) \
             ON CONFLICT (id) DO NOTHING RETURNING 1"
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
    s.expect_rows("placed_lines", lines, first.id);
    Ok(())
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
