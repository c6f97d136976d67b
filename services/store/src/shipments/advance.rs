//! The warehouse's steps: the shipments due now moved one step on, and
//! when the next one falls due, so that fulfillment looks again then
//! rather than on a fixed tick.

use super::{ShipmentRow, HELD};
use crate::write::{self, Changes};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::shipment::{self, Shipment, ShipmentCommand, ShipmentState};
use events::Metadata;
use sqlx::PgPool;
use std::sync::LazyLock;
use std::time::Duration;
use uuid::Uuid;

/// What [`advance_due`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advanced {
    /// Shipments moved one step on.
    pub steps: u64,
    /// The orders whose shipment shipped in this transaction: the ones whose
    /// capture is due now (`crate::captures::decide_for`).
    pub shipped: Vec<Uuid>,
    /// How long until the next open shipment falls due: one not taken now,
    /// or one moved now (a step from now); `Some(ZERO)`: more are due
    /// already, past the limit; `None` when no shipment is open. A shipment
    /// a dispute holds is not counted.
    pub next_due: Option<Duration>,
}

/// The open shipments (alias `s`): neither delivered nor cancelled. `open`
/// is a generated column that changes only when a shipment leaves the
/// warehouse, so the steps before are HOT updates (see the
/// `shipment_steps_in_place` migration); `shipments_open` holds the open
/// ones by creation time.
const OPEN: &str = "s.open";

/// The due shipments, locked (skipping those another process holds, at
/// most `$2`, the oldest first), then one row whose other columns are
/// NULL with the seconds until the first open shipment not due yet falls
/// due (NULL: none). One statement, so that a look that finds nothing
/// also says when to look again. Both halves walk `shipments_open`, every
/// open shipment, and read each one's `updated_at` from its row: no index
/// holds `updated_at`, which every step changes.
static DUE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH due AS MATERIALIZED (SELECT id, order_id, state, version, updated_at FROM shipments s \
             WHERE {OPEN} AND s.updated_at <= now() - make_interval(secs => $1) \
             AND NOT EXISTS ({HELD} AND h.order_id = s.order_id) \
             ORDER BY s.updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         SELECT id, order_id, state, version, updated_at, NULL::float8 AS next_in FROM due \
         UNION ALL \
         SELECT NULL, NULL, NULL, NULL, NULL, \
             (SELECT extract(epoch FROM min(s.updated_at) + make_interval(secs => $1) - now())::float8 \
              FROM shipments s WHERE {OPEN} AND s.updated_at > now() - make_interval(secs => $1) \
              AND NOT EXISTS ({HELD} AND h.order_id = s.order_id))"
    )
});

/// Which of the orders `$1` a dispute holds the shipment of, read again
/// once the due shipments are locked.
static HELD_AMONG_SQL: LazyLock<String> =
    LazyLock::new(|| format!("{HELD} AND h.order_id = ANY($1)"));

/// A row of [`DUE_SQL`]: a due shipment, or (every column NULL but
/// `next_in`) when the next one falls due.
#[derive(sqlx::FromRow)]
struct DueRow {
    id: Option<Uuid>,
    order_id: Option<Uuid>,
    state: Option<String>,
    version: Option<i32>,
    updated_at: Option<DateTime<Utc>>,
    next_in: Option<f64>,
}

/// Moves every shipment whose last step is older than `step_delay` one
/// step on, at most `limit` in one transaction; safe with N processes.
/// A shipment held by a dispute (`shipment_holds`) never moves, nor does a
/// cancelled one. Says when the next shipment falls due.
/// `source` names the caller in the events' metadata.
pub async fn advance_due(
    pool: &PgPool,
    step_delay: Duration,
    limit: i64,
    source: &str,
) -> Result<Advanced, StoreError> {
    let mut tx = pool.begin().await?;
    // Planned at each look, not kept prepared: a plan kept from a nearly
    // empty `shipments` (a new store's first looks) walked the whole grown
    // table twice per look, where planned on the table as it is each look
    // walks `shipments_open` (`fulfillment::the_look_for_due_shipments_reads_no_delivered_one_however_the_table_grew`).
    let rows: Vec<DueRow> = sqlx::query_as(DUE_SQL.as_str())
        .persistent(false)
        .bind(step_delay.as_secs_f64())
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
    let mut next_in = None;
    let mut due = Vec::with_capacity(rows.len());
    for row in rows {
        match (row.id, row.order_id, row.state, row.version, row.updated_at) {
            (Some(id), Some(order_id), Some(state), Some(version), Some(updated_at)) => {
                due.push(ShipmentRow {
                    id,
                    order_id,
                    state,
                    version,
                    updated_at,
                });
            }
            _ => next_in = row.next_in,
        }
    }
    let mut advanced = Advanced {
        next_due: next_in.map(|s| Duration::try_from_secs_f64(s).unwrap_or_default()),
        ..Advanced::default()
    };
    if i64::try_from(due.len()).is_ok_and(|n| n >= limit) {
        advanced.next_due = Some(Duration::ZERO);
    }
    if due.is_empty() {
        // Most looks under a light load: nothing to write (the transaction rolls back).
        return Ok(advanced);
    }
    // A dispute may have held one of them after the statement above took its snapshot (a hold
    // commits with its shipment's row locked, so it was unlocked again by the time this locked
    // it): looked for again, in a snapshot taken now.
    let orders: Vec<Uuid> = due.iter().map(|r| r.order_id).collect();
    let held: Vec<Uuid> = sqlx::query_scalar(HELD_AMONG_SQL.as_str())
        .bind(&orders)
        .fetch_all(&mut *tx)
        .await?;
    let mut changes = Changes::new();
    for row in due.into_iter().filter(|r| !held.contains(&r.order_id)) {
        let current = Shipment::try_from(row)?;
        let events = shipment::decide(
            Some(&current),
            ShipmentCommand::Advance { at: crate::now() },
        );
        if events.is_empty() {
            continue;
        }
        let meta = Metadata::spontaneous(source, current.order_id);
        changes.shipment(Some(&current), &events, &meta)?;
        advanced.steps += 1;
        if events.iter().any(|e| e.state == ShipmentState::Shipped) {
            advanced.shipped.push(current.order_id);
        }
    }
    write::commit(&mut tx, &changes).await?;
    tx.commit().await?;
    if advanced.steps > 0 {
        // What moved now falls due a step from now (unless it was delivered).
        advanced.next_due = Some(advanced.next_due.map_or(step_delay, |d| d.min(step_delay)));
    }
    Ok(advanced)
}
