//! Rebuilding every projection the events define — `orders` (with
//! `order_lines`) and `shipments` — from the event store. A projection is a
//! cache of each stream's fold; rebuilding must reproduce it exactly.

use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::ShipmentEvent;
use domain::Event;
use futures::TryStreamExt;
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use uuid::Uuid;

/// What a rebuild found in one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableReport {
    /// Rows folded from their events.
    pub rows: u64,
    /// Rows that differed from their fold before the rebuild.
    pub corrected: u64,
    /// Rows with no events, removed.
    pub orphans_removed: u64,
}

/// What a rebuild found, per table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildReport {
    pub orders: TableReport,
    pub shipments: TableReport,
}

/// Every projection row with its lines, as JSON, by order id.
pub async fn snapshot(
    conn: &mut PgConnection,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    rows(
        conn,
        "SELECT o.id, to_jsonb(o.*) || jsonb_build_object('lines', \
            (SELECT coalesce(jsonb_agg(to_jsonb(l.*) ORDER BY l.sku COLLATE \"C\"), '[]') FROM order_lines l WHERE l.order_id = o.id)) \
         FROM orders o",
    )
    .await
}

/// Every shipment row, as JSON, by shipment id.
pub async fn snapshot_shipments(
    conn: &mut PgConnection,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    rows(conn, "SELECT s.id, to_jsonb(s.*) FROM shipments s").await
}

async fn rows(
    conn: &mut PgConnection,
    sql: &str,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    Ok(sqlx::query_as::<_, (Uuid, serde_json::Value)>(sql)
        .fetch(&mut *conn)
        .try_collect()
        .await?)
}

/// Replaces every projection with the fold of the event store, in one
/// transaction that blocks writers of the projections meanwhile.
pub async fn rebuild(pool: &PgPool) -> Result<RebuildReport, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE orders, order_lines, shipments IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let orders_before = snapshot(&mut tx).await?;
    let shipments_before = snapshot_shipments(&mut tx).await?;
    // Shipments reference orders: out first, back in last.
    for table in ["shipments", "order_lines", "orders"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&mut *tx)
            .await?;
    }
    let mut report = RebuildReport::default();
    let mut rebuilt = Vec::with_capacity(1000);
    for (stream, events) in streams(&mut tx, "order.%").await? {
        let events: Vec<Event> = events
            .into_iter()
            .map(|(t, data)| Event::from_parts(&t, data))
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::Corrupt(format!("event of order {stream}: {e}")))?;
        let order = domain::fold(&events)
            .ok_or_else(|| StoreError::Corrupt(format!("order {stream} has no order.placed")))?;
        rebuilt.push(order);
        if rebuilt.len() == 1000 {
            crate::orders::insert_projections(&mut tx, &rebuilt).await?;
            rebuilt.clear();
        }
        report.orders.rows += 1;
    }
    crate::orders::insert_projections(&mut tx, &rebuilt).await?;
    for (stream, events) in streams(&mut tx, "shipment.%").await? {
        write_shipment(&mut tx, stream, &events).await?;
        report.shipments.rows += 1;
    }
    let orders_after = snapshot(&mut tx).await?;
    let shipments_after = snapshot_shipments(&mut tx).await?;
    report.orders = compare(&orders_before, &orders_after, report.orders.rows);
    report.shipments = compare(&shipments_before, &shipments_after, report.shipments.rows);
    tx.commit().await?;
    Ok(report)
}

fn compare(
    before: &BTreeMap<Uuid, serde_json::Value>,
    after: &BTreeMap<Uuid, serde_json::Value>,
    rows: u64,
) -> TableReport {
    TableReport {
        rows,
        corrected: after
            .iter()
            .filter(|(id, row)| before.get(id) != Some(row))
            .count() as u64,
        orphans_removed: before.keys().filter(|id| !after.contains_key(id)).count() as u64,
    }
}

type Stream = (Uuid, Vec<(String, serde_json::Value)>);

/// The events of every stream whose types match `pattern`, grouped by stream in version order.
async fn streams(conn: &mut PgConnection, pattern: &str) -> Result<Vec<Stream>, StoreError> {
    let rows: Vec<(Uuid, String, serde_json::Value)> = sqlx::query_as(
        "SELECT stream_id, type, data FROM events WHERE type LIKE $1 ORDER BY stream_id, version",
    )
    .bind(pattern)
    .fetch_all(&mut *conn)
    .await?;
    let mut grouped: Vec<Stream> = vec![];
    for (stream, t, data) in rows {
        match grouped.last_mut() {
            Some((s, events)) if *s == stream => events.push((t, data)),
            _ => grouped.push((stream, vec![(t, data)])),
        }
    }
    Ok(grouped)
}

/// Folds one shipment's events into its row: the last step's state, the
/// first step's time as created, the last one's as updated.
async fn write_shipment(
    conn: &mut PgConnection,
    id: Uuid,
    events: &[(String, serde_json::Value)],
) -> Result<(), StoreError> {
    let parsed: Vec<ShipmentEvent> = events
        .iter()
        .map(|(_, data)| serde_json::from_value(data.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("event of shipment {id}: {e}")))?;
    let (Some(first), Some(last)) = (parsed.first(), parsed.last()) else {
        return Ok(());
    };
    let created: DateTime<Utc> = first.at;
    sqlx::query("INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(id)
        .bind(last.order_id)
        .bind(last.state.as_str())
        .bind(i32::try_from(parsed.len()).unwrap_or(i32::MAX))
        .bind(created)
        .bind(last.at)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Writes one order's projection row and lines (into whatever `orders` the
/// connection's search path names: the live one, or a replay's scratch schema).
pub async fn write(conn: &mut PgConnection, order: &domain::Order) -> Result<(), StoreError> {
    crate::orders::insert_projections(conn, std::slice::from_ref(order)).await
}
