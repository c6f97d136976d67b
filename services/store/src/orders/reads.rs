//! Orders read from the projection: one, many, locked, streamed, an
//! account's pages.

use super::row::{select_orders, OrderRow};
use crate::StoreError;
use domain::{Event, Order};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Age in seconds of the oldest reservation still waiting for payment.
pub async fn oldest_pending_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM orders WHERE state = 'payment_pending'",
    )
    .fetch_one(pool)
    .await?)
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
    let lock = match waiting {
        Waiting::Wait => "wait",
        Waiting::NoWait => "nowait",
    };
    let rows: Result<Vec<OrderRow>, sqlx::Error> = sqlx::query_as(BY_ID_SQL)
        .bind(ids)
        .bind(lock)
        .fetch_all(&mut *conn)
        .await;
    let rows = match rows {
        // lock_not_available: another writer holds one of the rows.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            return Err(StoreError::Busy(ids.first().copied().unwrap_or_default()))
        }
        other => other?,
    };
    rows.into_iter().map(Order::try_from).collect()
}

/// The orders of a key set (`$1`), read (`$2` = `'none'`) or locked in id
/// order (`'wait'`, `'nowait'`). A function that plans its statement at each
/// call with the ids given (migration 33): prepared, `o.id = ANY($1)` could
/// keep a plan made on a nearly empty `orders` and read the whole grown
/// table at each call. The call itself is kept prepared: one round trip.
pub const BY_ID_SQL: &str = "SELECT * FROM orders_by_id($1, $2)";

/// A page of an account's orders (`$1`), newest first, after (`$2`, `$3`)
/// when not NULL, at most `$4`: through `orders_of_account`, planned at each
/// call for the reason given at [`BY_ID_SQL`].
pub const PAGE_SQL: &str = "SELECT * FROM orders_of_account($1, $2, $3, $4)";

/// One order (`$1`), read through `orders_by_id`, if it is `$2`'s (any
/// account's when `$2` is NULL).
pub const ONE_SQL: &str = "SELECT * FROM orders_by_id(ARRAY[$1::uuid], 'none') \
                           WHERE $2::uuid IS NULL OR account_id = $2";

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
    let rows: Vec<OrderRow> = sqlx::query_as(BY_ID_SQL)
        .bind(ids)
        .bind("none")
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
    let rows: Vec<OrderRow> = sqlx::query_as(PAGE_SQL)
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
/// Through `orders_by_id`, planned at each call: a buyer polling an order
/// in a new store's first minute must not scan the grown table on a plan
/// made while it was empty (see [`BY_ID_SQL`]).
pub async fn load(
    pool: &PgPool,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Order>, StoreError> {
    let row: Option<OrderRow> = sqlx::query_as(ONE_SQL)
        .bind(order_id)
        .bind(account)
        .fetch_optional(pool)
        .await?;
    row.map(Order::try_from).transpose()
}

/// The order (`$1`) locked for update, if it is `$2`'s (any account's when
/// `$2` is NULL), in one round trip through `orders_by_id`, planned at each
/// call (see [`BY_ID_SQL`]). The inner call checks the account without a
/// lock, so a buyer never locks another account's order; the outer one
/// locks what it let through (an order's account never changes). Prepared,
/// this read kept a plan made while `orders` was nearly empty: a scan of
/// the whole table for each buyer's cancel, operator's command, refund
/// or dispute on it from then on.
pub const LOCKED_SQL: &str = "SELECT * FROM orders_by_id(ARRAY(\
        SELECT o.id FROM orders_by_id(ARRAY[$1::uuid], 'none') o \
        WHERE $2::uuid IS NULL OR o.account_id = $2), 'wait')";

/// The order locked for update in the caller's transaction, if it is
/// `account`'s (any account's when `None`): see [`LOCKED_SQL`].
pub(crate) async fn load_locked(
    conn: &mut PgConnection,
    order_id: Uuid,
    account: Option<Uuid>,
) -> Result<Option<Order>, StoreError> {
    let row: Option<OrderRow> = sqlx::query_as(LOCKED_SQL)
        .bind(order_id)
        .bind(account)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(Order::try_from).transpose()
}
