//! Rebuilding the projections from the event store in batches, beside live
//! traffic. The orders (then the shipments) are walked in id order, a batch
//! of streams at a time, each batch one short transaction: lock the live
//! rows of the batch's id range (in the order every writer locks them),
//! read their events (a writer that held a row committed
//! first, so its events are read), fold them into temporary tables, and
//! write back only what differs — an `UPDATE` of a row whose columns
//! differ, an `INSERT` of a row missing, a `DELETE` of a row without
//! events. Placing an order never waits on it (a new order is an insert
//! the batch does not lock); a writer of an order in the batch waits for
//! one batch at most. The walk ends at the highest id there was when it
//! began: what is written later is the write path's own fold, and chasing
//! new orders would never end while checkout places them faster.
//!
//! The folded rows go through the same insert as the replay's
//! (`orders::insert_projections`), into session-temporary copies
//! of the tables that shadow the live ones on a connection of the
//! rebuild's own (closed at the end, so nothing else ever sees them), and
//! are compared with the live rows by PostgreSQL, column by column.

use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::ShipmentEvent;
use domain::Event;
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::{BTreeMap, HashSet};
use uuid::Uuid;

/// What a rebuild found in one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableReport {
    /// Rows folded from their events.
    pub rows: u64,
    /// Rows that differed from their fold (or were missing) and were written.
    pub corrected: u64,
    /// Rows with no events, removed.
    pub orphans_removed: u64,
}

/// What a rebuild found, per table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildReport {
    pub orders: TableReport,
    pub shipments: TableReport,
    /// Transactions it took.
    pub batches: u64,
}

/// Streams per batch unless told otherwise.
pub const DEFAULT_BATCH: i64 = 500;
/// Attempts at one batch that a deadlock or a lock timeout ended.
const ATTEMPTS: u32 = 5;

/// One projection table: its live name, its temporary copy's, its key and columns.
struct Table {
    live: String,
    scratch: String,
    key: &'static [&'static str],
    columns: Vec<String>,
}

/// The rebuild's connection and the tables it writes.
struct Session {
    conn: PgConnection,
    schema: String,
    orders: Table,
    lines: Table,
    shipments: Table,
}

/// Rebuilds orders (with their lines) then shipments, `batch` streams per transaction.
pub async fn run(pool: &PgPool, batch: i64) -> Result<RebuildReport, StoreError> {
    let batch = batch.max(1);
    let mut s = Session::open(pool).await?;
    let mut report = RebuildReport::default();
    for shipments in [false, true] {
        // The walk ends where the table and its streams ended when it began:
        // what is written later is written by the write path, already a
        // fold, and a walk that chased new orders would never end under load.
        let Some(end) = s.last_id(shipments).await? else {
            continue;
        };
        let mut after: Option<Uuid> = None;
        loop {
            let page = s.next_streams(shipments, after, end, batch).await?;
            let upper = match page.last() {
                Some(last) if page.len() as i64 == batch => *last,
                _ => end,
            };
            let mut attempt = 1;
            let done = loop {
                match s.batch(shipments, &page, after, upper).await {
                    Err(e) if attempt < ATTEMPTS && (e.is_transient() || e.is_unavailable()) => {
                        tracing::warn!(error = %e, attempt, "a rebuild batch gave way to a writer; running it again");
                        attempt += 1;
                    }
                    other => break other?,
                }
            };
            let table = if shipments {
                &mut report.shipments
            } else {
                &mut report.orders
            };
            table.rows += done.rows;
            table.corrected += done.corrected;
            table.orphans_removed += done.orphans_removed;
            report.batches += 1;
            if upper == end {
                break;
            }
            after = Some(upper);
        }
    }
    Ok(report)
}

impl Session {
    /// A connection of the rebuild's own, detached from the pool, with
    /// temporary copies of the projection tables that shadow the live ones
    /// (its search path puts them first); the live ones are named by schema.
    async fn open(pool: &PgPool) -> Result<Session, StoreError> {
        let mut conn = pool.acquire().await?.detach();
        let schema: String = sqlx::query_scalar("SELECT quote_ident(current_schema())")
            .fetch_one(&mut conn)
            .await?;
        sqlx::query("SELECT set_config('search_path', 'pg_temp, ' || $1, false)")
            .bind(&schema)
            .execute(&mut conn)
            .await?;
        for table in ["orders", "order_lines", "shipments"] {
            sqlx::query(&format!(
                "CREATE TEMP TABLE {table} (LIKE {schema}.{table} INCLUDING ALL) ON COMMIT DELETE ROWS"
            ))
            .execute(&mut conn)
            .await?;
        }
        let orders = Table::read(&mut conn, &schema, "orders", &["id"]).await?;
        let lines = Table::read(&mut conn, &schema, "order_lines", &["order_id", "sku"]).await?;
        let shipments = Table::read(&mut conn, &schema, "shipments", &["id"]).await?;
        Ok(Session {
            conn,
            schema,
            orders,
            lines,
            shipments,
        })
    }

    /// The highest id among the live rows and the streams of orders (or
    /// shipments) now; `None` when there are none.
    async fn last_id(&mut self, shipments: bool) -> Result<Option<Uuid>, StoreError> {
        let table = if shipments {
            &self.shipments
        } else {
            &self.orders
        };
        Ok(sqlx::query_scalar(&format!(
            "SELECT greatest( \
                 (SELECT stream_id FROM {}.events WHERE version = 1 AND type LIKE $1 \
                  ORDER BY stream_id DESC LIMIT 1), \
                 (SELECT id FROM {} ORDER BY id DESC LIMIT 1))",
            self.schema, table.live
        ))
        .bind(pattern(shipments))
        .fetch_one(&mut self.conn)
        .await?)
    }

    /// The next `limit` order (or shipment) streams after `after`, up to
    /// `end`, in id order.
    async fn next_streams(
        &mut self,
        shipments: bool,
        after: Option<Uuid>,
        end: Uuid,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT stream_id FROM {}.events WHERE version = 1 AND type LIKE $1 \
               AND ($2::uuid IS NULL OR stream_id > $2) AND stream_id <= $3 \
             ORDER BY stream_id LIMIT $4",
            self.schema
        ))
        .bind(pattern(shipments))
        .bind(after)
        .bind(end)
        .bind(limit)
        .fetch_all(&mut self.conn)
        .await?)
    }

    /// One batch: the streams of `page` and every live row in `(after, upper]`.
    async fn batch(
        &mut self,
        shipments: bool,
        page: &[Uuid],
        after: Option<Uuid>,
        upper: Uuid,
    ) -> Result<TableReport, StoreError> {
        let mut tx = self.conn.begin().await?;
        // Every statement joins a batch's rows to a live table by its key:
        // never a hash or merge join, which could read the whole live table
        // for each batch (the temporary copies are never analyzed).
        sqlx::query(
            "SELECT set_config('lock_timeout', '5s', true), \
                    set_config('enable_hashjoin', 'off', true), \
                    set_config('enable_mergejoin', 'off', true)",
        )
        .execute(&mut *tx)
        .await?;
        // Rows in id order, as every writer of orders locks them; shipments
        // by order, as fulfillment locks them. `NO KEY UPDATE` excludes every
        // writer of these rows but lets a new shipment or line refer to one.
        let (table, order) = if shipments {
            (&self.shipments, "order_id")
        } else {
            (&self.orders, "id")
        };
        let locked: Vec<Uuid> = sqlx::query_scalar(&format!(
            "SELECT id FROM {} WHERE ($1::uuid IS NULL OR id > $1) AND id <= $2 \
             ORDER BY {order} FOR NO KEY UPDATE",
            table.live
        ))
        .bind(after)
        .bind(upper)
        .fetch_all(&mut *tx)
        .await?;
        let mut ids: Vec<Uuid> = page.iter().chain(&locked).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let streams = events_of(&mut tx, &self.schema, &ids, pattern(shipments)).await?;
        let mut report = TableReport {
            rows: streams.len() as u64,
            ..TableReport::default()
        };
        let mut changed: HashSet<Uuid> = HashSet::new();
        if shipments {
            for (id, events) in &streams {
                write_shipment(&mut tx, *id, events).await?;
            }
            changed.extend(upsert(&mut tx, &self.shipments).await?);
            report.orphans_removed = remove_extra(&mut tx, &self.shipments, "id", &locked)
                .await?
                .len() as u64;
        } else {
            let mut folded = Vec::with_capacity(streams.len());
            for (id, events) in &streams {
                folded.push(fold_order(*id, events)?);
            }
            crate::orders::insert_projections(&mut tx, &folded).await?;
            changed.extend(upsert(&mut tx, &self.orders).await?);
            changed.extend(upsert(&mut tx, &self.lines).await?);
            changed.extend(remove_extra(&mut tx, &self.lines, "order_id", &ids).await?);
            report.orphans_removed = remove_extra(&mut tx, &self.orders, "id", &locked)
                .await?
                .len() as u64;
        }
        report.corrected = changed
            .iter()
            .filter(|id| streams.contains_key(*id))
            .count() as u64;
        tx.commit().await?;
        Ok(report)
    }
}

impl Table {
    /// The table's columns, as its temporary copy has them, but for the
    /// generated ones (shipments' `open`): PostgreSQL computes those from
    /// the rest, and refuses a value written to them.
    async fn read(
        conn: &mut PgConnection,
        schema: &str,
        name: &str,
        key: &'static [&'static str],
    ) -> Result<Table, StoreError> {
        let columns = sqlx::query_scalar(
            "SELECT quote_ident(attname) FROM pg_attribute \
             WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        )
        .bind(format!("pg_temp.{name}"))
        .fetch_all(&mut *conn)
        .await?;
        Ok(Table {
            live: format!("{schema}.{name}"),
            scratch: format!("pg_temp.{name}"),
            key,
            columns,
        })
    }

    /// `a.k = b.k AND …` over the key.
    fn same_key(&self, a: &str, b: &str) -> String {
        self.key
            .iter()
            .map(|k| format!("{a}.{k} = {b}.{k}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `a.c1, a.c2, …` over every column.
    fn each(&self, alias: &str) -> String {
        self.columns
            .iter()
            .map(|c| format!("{alias}.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Writes the folded rows of `t` over the live ones where a column differs,
/// and adds those missing; the first key column of every row written.
async fn upsert(conn: &mut PgConnection, t: &Table) -> Result<Vec<Uuid>, StoreError> {
    let set = t
        .columns
        .iter()
        .filter(|c| !t.key.contains(&c.as_str()))
        .map(|c| format!("{c} = r.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let key = t.key[0];
    let sql = format!(
        "WITH updated AS ( \
             UPDATE {live} o SET {set} FROM {scratch} r \
             WHERE {same} AND ({o}) IS DISTINCT FROM ({r}) RETURNING o.{key}), \
         inserted AS ( \
             INSERT INTO {live} ({columns}) SELECT {r} FROM {scratch} r \
             WHERE NOT EXISTS (SELECT 1 FROM {live} o WHERE {same}) RETURNING {key}) \
         SELECT {key} FROM updated UNION SELECT {key} FROM inserted",
        live = t.live,
        scratch = t.scratch,
        same = t.same_key("o", "r"),
        o = t.each("o"),
        r = t.each("r"),
        columns = t.columns.join(", "),
    );
    Ok(sqlx::query_scalar(&sql).fetch_all(conn).await?)
}

/// Deletes the live rows of `t` whose `scope` is among `ids` and which the
/// fold did not produce; the `scope` of each row deleted.
async fn remove_extra(
    conn: &mut PgConnection,
    t: &Table,
    scope: &str,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    let sql = format!(
        "DELETE FROM {live} o WHERE o.{scope} = ANY($1) \
           AND NOT EXISTS (SELECT 1 FROM {scratch} r WHERE {same}) RETURNING o.{scope}",
        live = t.live,
        scratch = t.scratch,
        same = t.same_key("o", "r"),
    );
    Ok(sqlx::query_scalar(&sql).bind(ids).fetch_all(conn).await?)
}

fn pattern(shipments: bool) -> &'static str {
    if shipments {
        "shipment.%"
    } else {
        "order.%"
    }
}

type Parts = Vec<(String, serde_json::Value)>;

/// The events of `ids` whose types match `pattern`, by stream, in version order.
async fn events_of(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[Uuid],
    pattern: &str,
) -> Result<BTreeMap<Uuid, Parts>, StoreError> {
    let rows: Vec<(Uuid, String, serde_json::Value)> = sqlx::query_as(&format!(
        "SELECT stream_id, type, data FROM {schema}.events \
         WHERE stream_id = ANY($1) AND type LIKE $2 ORDER BY stream_id, version"
    ))
    .bind(ids)
    .bind(pattern)
    .fetch_all(conn)
    .await?;
    let mut streams: BTreeMap<Uuid, Parts> = BTreeMap::new();
    for (stream, t, data) in rows {
        streams.entry(stream).or_default().push((t, data));
    }
    Ok(streams)
}

fn fold_order(id: Uuid, parts: &Parts) -> Result<domain::Order, StoreError> {
    let events: Vec<Event> = parts
        .iter()
        .map(|(t, data)| Event::from_parts(t, data.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("event of order {id}: {e}")))?;
    domain::fold(&events)
        .ok_or_else(|| StoreError::Corrupt(format!("order {id} has no order.placed")))
}

/// Folds one shipment's events into its row (in the temporary copy): the
/// last step's state, the first step's time as created, the last one's as
/// updated.
async fn write_shipment(
    conn: &mut PgConnection,
    id: Uuid,
    parts: &Parts,
) -> Result<(), StoreError> {
    let parsed: Vec<ShipmentEvent> = parts
        .iter()
        .map(|(_, data)| serde_json::from_value(data.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("event of shipment {id}: {e}")))?;
    let (Some(first), Some(last)) = (parsed.first(), parsed.last()) else {
        return Ok(());
    };
    let created: DateTime<Utc> = first.at;
    sqlx::query("INSERT INTO pg_temp.shipments (id, order_id, state, version, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(id)
        .bind(last.order_id)
        .bind(last.state.as_str())
        .bind(i32::try_from(parsed.len()).unwrap_or(i32::MAX))
        .bind(created)
        .bind(last.at)
        .execute(conn)
        .await?;
    Ok(())
}
