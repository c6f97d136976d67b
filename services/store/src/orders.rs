//! Orders: the event store, its orders projection, and the transactions
//! that change them (placing them is `placing`). Each commits the events, the projection, the stock
//! movements with their ledger rows and the outbox rows together.

use crate::write::{self, Changes, Statement, Written};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Command, DomainError, Event, Order, OrderLine, OrderState, Sku};
use events::Metadata;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// What became of a command on an existing order.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Events were recorded; the order as it is now.
    Applied(Order),
    /// The command was already in effect: nothing recorded.
    Unchanged(Order),
    Refused(DomainError),
    NotFound,
    /// The units the command needed are gone (a late payment's reclaim).
    StockShort(Sku),
}

/// Runs `command` against an order under a row lock, in a transaction of
/// its own: decide, move stock, append. `account` scopes the lookup.
#[tracing::instrument(skip_all, fields(order_id = %order_id))]
pub async fn transition(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
    meta: &Metadata,
    command: impl FnOnce(&Order) -> Command,
) -> Result<Transition, StoreError> {
    let mut tx = pool.begin().await?;
    let outcome = transition_in(&mut tx, order_id, account, meta, command).await?;
    if matches!(outcome, Transition::Applied(_)) {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// Like [`transition`], inside the caller's transaction, which the caller
/// commits; on anything but `Applied` nothing was written (but the caller
/// must roll back after `StockShort`).
pub async fn transition_in(
    conn: &mut PgConnection,
    order_id: Uuid,
    account: Option<Uuid>,
    meta: &Metadata,
    command: impl FnOnce(&Order) -> Command,
) -> Result<Transition, StoreError> {
    let Some(order) = load_locked(conn, order_id, account).await? else {
        return Ok(Transition::NotFound);
    };
    let events = match domain::decide(Some(&order), command(&order)) {
        Ok(events) => events,
        Err(e) => return Ok(Transition::Refused(e)),
    };
    if events.is_empty() {
        return Ok(Transition::Unchanged(order));
    }
    Ok(match apply(conn, &order, &events, meta).await? {
        Applied::Done(next) => Transition::Applied(*next),
        Applied::StockShort(sku) => Transition::StockShort(sku),
    })
}

/// What became of decided events.
pub(crate) enum Applied {
    Done(Box<Order>),
    /// A stock movement lacked the units: nothing may be committed.
    StockShort(Sku),
}

/// Writes `events` on `order` (stock, events, outbox, projection) in the
/// caller's transaction; the caller rolls back after `StockShort`.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    order: &Order,
    events: &[Event],
    meta: &Metadata,
) -> Result<Applied, StoreError> {
    let mut changes = Changes::new();
    let next = changes.order(Some(order), events, meta)?;
    Ok(match write::commit(conn, &changes).await? {
        Written::Done => Applied::Done(Box::new(next)),
        Written::StockShort(sku) => Applied::StockShort(sku),
    })
}

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

/// The projection row with its lines, as one query.
macro_rules! select_orders {
    () => {
        "SELECT o.id, o.account_id, o.state, o.currency, o.total_minor, o.shipping, o.payment_id, o.paid_minor, \
            o.version, o.expires_at, o.created_at, o.updated_at, o.refunds, o.capture, o.operator_refunds, o.next_action, o.disputes, \
            (SELECT coalesce(jsonb_agg(jsonb_build_object('sku', l.sku, 'quantity', l.quantity, 'unit_price_minor', l.unit_price_minor) ORDER BY l.sku COLLATE \"C\"), '[]') \
               FROM order_lines l WHERE l.order_id = o.id) AS lines \
         FROM orders o"
    };
}
pub(crate) use select_orders;

/// Age in seconds of the oldest reservation still waiting for payment.
pub async fn oldest_pending_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM orders WHERE state = 'payment_pending'",
    )
    .fetch_one(pool)
    .await?)
}

#[derive(sqlx::FromRow)]
pub(crate) struct OrderRow {
    pub(crate) id: Uuid,
    account_id: Uuid,
    state: String,
    currency: String,
    total_minor: i64,
    shipping: Option<serde_json::Value>,
    payment_id: Option<String>,
    paid_minor: Option<i64>,
    version: i32,
    expires_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    refunds: serde_json::Value,
    capture: Option<String>,
    operator_refunds: serde_json::Value,
    next_action: Option<serde_json::Value>,
    disputes: serde_json::Value,
    lines: serde_json::Value,
}

pub(crate) const SELECT_ORDER: &str = concat!(
    select_orders!(),
    " WHERE o.id = $1 AND ($2::uuid IS NULL OR o.account_id = $2)"
);

/// An order's `state` column as the domain's state.
pub(crate) fn parse_state(order_id: Uuid, state: &str) -> Result<OrderState, StoreError> {
    serde_json::from_value(serde_json::Value::String(state.to_owned()))
        .map_err(|_| StoreError::Corrupt(format!("order {order_id}: state")))
}

impl TryFrom<OrderRow> for Order {
    type Error = StoreError;
    fn try_from(r: OrderRow) -> Result<Order, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("order {}: {what}", r.id));
        let state = parse_state(r.id, &r.state)?;
        let lines: Vec<OrderLine> =
            serde_json::from_value(r.lines.clone()).map_err(|_| corrupt("lines"))?;
        let shipping = r
            .shipping
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| corrupt("shipping"))?;
        let refunds = serde_json::from_value(r.refunds.clone()).map_err(|_| corrupt("refunds"))?;
        let disputes =
            serde_json::from_value(r.disputes.clone()).map_err(|_| corrupt("disputes"))?;
        let capture =
            domain::Capture::from_column(r.capture.as_deref()).ok_or_else(|| corrupt("capture"))?;
        let operator_refunds = serde_json::from_value(r.operator_refunds.clone())
            .map_err(|_| corrupt("operator_refunds"))?;
        let next_action = r
            .next_action
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| corrupt("next_action"))?;
        Ok(Order {
            id: r.id,
            account_id: r.account_id,
            state,
            lines,
            currency: r.currency.parse().map_err(|_| corrupt("currency"))?,
            total_minor: r.total_minor,
            shipping,
            expires_at: r.expires_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            payment: r.payment_id.map(|payment_id| domain::order::PaymentRef {
                payment_id,
                amount_minor: r.paid_minor.unwrap_or_default(),
                capture,
            }),
            refunds,
            operator_refunds,
            next_action,
            disputes,
            version: r.version,
        })
    }
}

/// Whether a writer waits for the rows another writer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Until the holder commits (every path's default).
    Wait,
    /// Not at all: a row held elsewhere is `StoreError::Busy`.
    NoWait,
}

/// The orders with these ids, locked for update (in id order); with
/// [`Waiting::NoWait`], `StoreError::Busy` naming the first id when any of
/// the rows is held by another writer.
pub(crate) async fn load_many_locking(
    conn: &mut PgConnection,
    ids: &[Uuid],
    waiting: Waiting,
) -> Result<Vec<Order>, StoreError> {
    const WAIT: &str = concat!(
        select_orders!(),
        " WHERE o.id = ANY($1) ORDER BY o.id FOR UPDATE OF o"
    );
    const NO_WAIT: &str = concat!(
        select_orders!(),
        " WHERE o.id = ANY($1) ORDER BY o.id FOR UPDATE OF o NOWAIT"
    );
    let sql = match waiting {
        Waiting::Wait => WAIT,
        Waiting::NoWait => NO_WAIT,
    };
    let rows: Result<Vec<OrderRow>, sqlx::Error> =
        sqlx::query_as(sql).bind(ids).fetch_all(&mut *conn).await;
    let rows = match rows {
        // lock_not_available: another writer holds one of the rows.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            return Err(StoreError::Busy(ids.first().copied().unwrap_or_default()))
        }
        other => other?,
    };
    rows.into_iter().map(Order::try_from).collect()
}

/// Every order of the projection, streamed.
pub fn stream_all(pool: &PgPool) -> impl futures::Stream<Item = Result<Order, StoreError>> + '_ {
    use futures::StreamExt;
    sqlx::query_as::<_, OrderRow>(select_orders!())
        .fetch(pool)
        .map(|r| r.map_err(StoreError::from).and_then(Order::try_from))
}

/// Every projection row (or those of `only`) with its events in recorded
/// order, streamed in one query (each row's events aggregated beside it),
/// for the audit.
pub(crate) fn stream_with_history<'a>(
    conn: &'a mut PgConnection,
    only: Option<&'a [Uuid]>,
) -> impl futures::Stream<Item = Result<(Order, Vec<Event>), StoreError>> + 'a {
    use futures::StreamExt;
    #[derive(sqlx::FromRow)]
    struct WithHistory {
        #[sqlx(flatten)]
        row: OrderRow,
        history: serde_json::Value,
    }
    const SQL: &str = concat!(
        "SELECT x.*, (SELECT coalesce(jsonb_agg(jsonb_build_array(e.type, e.data) ORDER BY e.version), '[]') \
            FROM events e WHERE e.stream_id = x.id) AS history FROM (",
        select_orders!(),
        ") x"
    );
    const SOME: &str = concat!(
        "SELECT x.*, (SELECT coalesce(jsonb_agg(jsonb_build_array(e.type, e.data) ORDER BY e.version), '[]') \
            FROM events e WHERE e.stream_id = x.id) AS history FROM (",
        select_orders!(),
        " WHERE o.id = ANY($1)) x"
    );
    let rows = match only {
        None => sqlx::query_as::<_, WithHistory>(SQL).fetch(conn),
        Some(ids) => sqlx::query_as::<_, WithHistory>(SOME).bind(ids).fetch(conn),
    };
    rows.map(|r| {
        let r = r?;
        let id = r.row.id;
        let parts: Vec<(String, serde_json::Value)> = serde_json::from_value(r.history)
            .map_err(|e| StoreError::Corrupt(format!("events of {id}: {e}")))?;
        let events = parts
            .into_iter()
            .map(|(t, data)| Event::from_parts(&t, data))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Corrupt(format!("event of {id}: {e}")))?;
        Ok((Order::try_from(r.row)?, events))
    })
}

/// The orders of `ids` that exist, in no particular order, read in one
/// query without locks.
pub async fn load_many(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<Order>, StoreError> {
    let rows: Vec<OrderRow> = sqlx::query_as(concat!(select_orders!(), " WHERE o.id = ANY($1)"))
        .bind(ids)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(Order::try_from).collect()
}

/// Where a page of an account's orders ends: the last order's creation time
/// and id (orders are listed newest first, ties by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEnd {
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub id: Uuid,
}

/// Up to `limit` of `account`'s orders, newest first, after `after` (a
/// keyset page: an order placed meanwhile never shifts a later page), and
/// where the page ends when more may follow.
pub async fn list_for_account(
    pool: &PgPool,
    account: Uuid,
    after: Option<PageEnd>,
    limit: i64,
) -> Result<(Vec<Order>, Option<PageEnd>), StoreError> {
    let rows: Vec<OrderRow> = sqlx::query_as(concat!(
        select_orders!(),
        " WHERE o.account_id = $1 AND ($2::timestamptz IS NULL OR (o.created_at, o.id) < ($2, $3)) \
         ORDER BY o.created_at DESC, o.id DESC LIMIT $4"
    ))
    .bind(account)
    .bind(after.map(|a| a.created_at))
    .bind(after.map(|a| a.id))
    .bind(limit + 1)
    .fetch_all(pool)
    .await?;
    let more = rows.len() as i64 > limit;
    let orders = rows
        .into_iter()
        .take(usize::try_from(limit).unwrap_or(0))
        .map(Order::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let end = orders.last().filter(|_| more).map(|o| PageEnd {
        created_at: o.created_at,
        id: o.id,
    });
    Ok((orders, end))
}

/// The order as the projection holds it; `account` scopes the lookup.
pub async fn load(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Order>, StoreError> {
    let row: Option<OrderRow> = sqlx::query_as(SELECT_ORDER)
        .bind(order_id)
        .bind(account)
        .fetch_optional(pool)
        .await?;
    row.map(Order::try_from).transpose()
}

pub(crate) async fn load_locked(
    conn: &mut PgConnection,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Order>, StoreError> {
    let sql = format!("{SELECT_ORDER} FOR UPDATE OF o");
    let row: Option<OrderRow> = sqlx::query_as(&sql)
        .bind(order_id)
        .bind(account)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(Order::try_from).transpose()
}

/// One recorded event of an order's history.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RecordedEvent {
    pub event_id: Uuid,
    pub position: i64,
    pub version: i32,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
}

/// An order's events in recorded order, or `None` if the order is not the
/// account's.
pub async fn history(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Vec<RecordedEvent>>, StoreError> {
    let owned: Option<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM orders WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(pool)
    .await?;
    if owned.is_none() {
        return Ok(None);
    }
    let events = sqlx::query_as(
        "SELECT event_id, position, version, type, data, recorded_at FROM events WHERE stream_id = $1 ORDER BY version",
    )
    .bind(order_id)
    .fetch_all(pool)
    .await?;
    Ok(Some(events))
}

/// One step of an order's way through the saga: an event recorded, or a
/// consumer taking it (its inbox row).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Stage {
    pub at: DateTime<Utc>,
    /// `recorded` or the consumer's name.
    pub by: String,
    /// The event's type name.
    pub event_type: String,
}

/// The steps of an order and its shipment, in time order, and the W3C
/// trace id its placement carried (what every service logs it under).
pub async fn stages(
    pool: &PgPool,
    order_id: Uuid,
) -> Result<(Vec<Stage>, Option<String>), StoreError> {
    let stages: Vec<Stage> = sqlx::query_as(
        "WITH ev AS (SELECT e.event_id, e.type, e.recorded_at FROM events e WHERE e.stream_id = $1 \
                     UNION ALL \
                     SELECT e.event_id, e.type, e.recorded_at FROM events e JOIN shipments s ON s.id = e.stream_id WHERE s.order_id = $1) \
         SELECT ev.recorded_at AS at, 'recorded' AS by, ev.type AS event_type FROM ev \
         UNION ALL \
         SELECT i.processed_at, i.consumer, ev.type FROM ev JOIN inbox i ON i.event_id = ev.event_id \
         ORDER BY 1, 2",
    )
    .bind(order_id)
    .fetch_all(pool)
    .await?;
    let traceparent: Option<String> = sqlx::query_scalar(
        "SELECT metadata->>'traceparent' FROM events WHERE stream_id = $1 AND version = 1",
    )
    .bind(order_id)
    .fetch_optional(pool)
    .await?
    .flatten();
    let trace_id = traceparent
        .and_then(|t| t.split('-').nth(1).map(str::to_owned))
        .filter(|t| t.len() == 32);
    Ok((stages, trace_id))
}

/// Folds an order's recorded events: the state the projection must equal.
pub fn fold_history(events: &[RecordedEvent]) -> Result<Option<Order>, StoreError> {
    let parsed: Vec<Event> = events
        .iter()
        .map(|e| Event::from_parts(&e.event_type, e.data.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("event: {e}")))?;
    Ok(domain::fold(&parsed))
}
