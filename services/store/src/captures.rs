//! Captures: with `CAPTURE_AT=shipment` an order confirms on an
//! authorization, and its money is taken only when its shipment ships.
//! Fulfillment decides each capture once, as the order's shipment ships
//! ([`decide_for`]; the sweep [`decide_shipped`] finds what that missed):
//! the order's `order.capture_decided` event and the payment row's
//! `capture_state = 'pending'` commit together. The payment worker then
//! carries it out like a compensation — claimed under a lease, asked with
//! the stable key `capture:<payment_id>` until the PSP confirms — and
//! [`complete_many`] records each round's `order.captured` events in one
//! transaction. A captured payment is never
//! voided: a void is only decided for a payment not attached to its order,
//! and a capture only for one attached.

use crate::orders::{self, Waiting};
use crate::write::{self, Changes};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::Command;
use events::Metadata;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// Metadata for what `source` records on these orders of its own accord:
/// the saga's correlation, on each order's own trace (that of its first
/// event), so a capture shows in the buyer's trace like every other step.
async fn on_order_traces(
    conn: &mut sqlx::PgConnection,
    source: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Metadata>, StoreError> {
    let rows: Vec<(Uuid, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT stream_id, traceparent, tracestate FROM events WHERE stream_id = ANY($1) AND version = 1",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, parent, state)| {
            let meta = Metadata::from_request(source, id, parent).with_tracestate(state);
            (id, meta)
        })
        .collect())
}

/// One capture to carry out.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Capture {
    pub payment_id: String,
    pub order_id: Uuid,
    /// The authorized amount: all of it is captured.
    pub amount_minor: i64,
    pub currency: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
    /// The order's trace (its first event's `traceparent` and
    /// `tracestate`), so the PSP call, its webhook and the log lines sit in
    /// the buyer's trace like every other step.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Capture {
    /// The PSP idempotency key of this capture: one per payment, ever.
    pub fn key(&self) -> String {
        format!("capture:{}", self.payment_id)
    }
}

/// Decides the capture of up to `limit` orders whose payment is only
/// authorized and whose shipment has shipped, oldest order first,
/// in one transaction; returns how many were decided. Orders another sweep
/// holds are skipped.
///
/// This is the safety net, not the usual way: it walks every authorized
/// order (or every open shipment, as the planner chooses), however many
/// wait to ship, so it runs seldom; the warehouse's step decides each
/// capture as its shipment ships ([`decide_for`]), and this sweep finds
/// what that missed (a process stopped between the two transactions, an
/// order its step skipped because another writer held it).
pub async fn decide_shipped(pool: &PgPool, limit: i64, source: &str) -> Result<usize, StoreError> {
    let sql = "SELECT o.id FROM orders o WHERE o.authorized \
         AND EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id AND s.state IN ('shipped', 'delivered')) \
         ORDER BY o.created_at, o.id LIMIT $1 FOR UPDATE OF o SKIP LOCKED";
    decide(pool, sqlx::query_scalar(sql).bind(limit), source).await
}

/// Decides the capture of these orders (the warehouse's step found their
/// shipments shipped), each one whose payment is only authorized and whose
/// shipment has shipped, in one transaction; returns how many were decided.
/// An order another writer holds is skipped: [`decide_shipped`] finds it.
pub async fn decide_for(pool: &PgPool, orders: &[Uuid], source: &str) -> Result<usize, StoreError> {
    if orders.is_empty() {
        return Ok(0);
    }
    let sql = "SELECT o.id FROM orders o WHERE o.id = ANY($1) AND o.authorized \
         AND EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id AND s.state IN ('shipped', 'delivered')) \
         ORDER BY o.id FOR UPDATE OF o SKIP LOCKED";
    decide(pool, sqlx::query_scalar(sql).bind(orders), source).await
}

/// Decides the capture of the orders `candidates` finds and locks, in one
/// transaction: each order's `order.capture_decided` and its payment's
/// `capture_state = 'pending'` commit together.
async fn decide<'q>(
    pool: &PgPool,
    candidates: sqlx::query::QueryScalar<'q, sqlx::Postgres, Uuid, sqlx::postgres::PgArguments>,
    source: &str,
) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    let ids: Vec<Uuid> = candidates.fetch_all(&mut *tx).await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let found = orders::load_many_locking(&mut tx, &ids, Waiting::Wait).await?;
    let metas = on_order_traces(&mut tx, source, &ids).await?;
    let at = crate::now();
    let mut changes = Changes::new();
    let mut payments: Vec<String> = Vec::with_capacity(found.len());
    for order in &found {
        let events = domain::decide(Some(order), Command::DecideCapture { at })
            .map_err(|e| StoreError::Corrupt(format!("order {}: {e}", order.id)))?;
        if events.is_empty() {
            continue;
        }
        let meta = metas
            .get(&order.id)
            .cloned()
            .unwrap_or_else(|| Metadata::spontaneous(source, order.id));
        changes.order(Some(order), &events, &meta)?;
        if let Some(payment) = &order.payment {
            payments.push(payment.payment_id.clone());
        }
    }
    write::commit(&mut tx, &changes).await?;
    let owed = sqlx::query(
        "UPDATE payments SET capture_state = 'pending', capture_decided_at = now(), capture_next_attempt_at = now() \
         WHERE payment_id = ANY($1) AND disposition = 'attached' AND capture_state IS NULL",
    )
    .bind(&payments)
    .execute(&mut *tx)
    .await?;
    if owed.rows_affected() != payments.len() as u64 {
        return Err(StoreError::Corrupt(format!(
            "deciding {} captures found {} payments to capture",
            payments.len(),
            owed.rows_affected()
        )));
    }
    tx.commit().await?;
    Ok(payments.len())
}

/// Claims up to `limit` due captures for `lease`; other owners skip them meanwhile. The
/// lease is its own column, which no index holds, so a claim updates the payment's row
/// in place; a leased capture keeps its place among the due ones, and a claim passes
/// over the leased ones (the captures in flight). Each
/// comes with its order's trace, read as `on_order_traces` reads it (one probe of the
/// order's first event).
pub async fn claim_due(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
) -> Result<Vec<Capture>, StoreError> {
    Ok(sqlx::query_as(
        "WITH claimed AS ( \
           UPDATE payments p SET capture_leased_until = now() + make_interval(secs => $2), capture_attempts = p.capture_attempts + 1 \
             FROM (SELECT payment_id FROM payments WHERE capture_state = 'pending' AND capture_next_attempt_at <= now() \
                     AND (capture_leased_until IS NULL OR capture_leased_until <= now()) \
                   ORDER BY capture_next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
            WHERE p.payment_id = due.payment_id \
           RETURNING p.payment_id, p.order_id, p.amount_minor, p.currency, p.capture_attempts) \
         SELECT c.payment_id, c.order_id, c.amount_minor, c.currency, c.capture_attempts AS attempts, \
                e.traceparent, e.tracestate \
           FROM claimed c LEFT JOIN events e ON e.stream_id = c.order_id AND e.version = 1",
    )
    .bind(limit)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// A capture the PSP confirmed: `captured_minor` of the payment taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub payment_id: String,
    pub captured_minor: i64,
}

/// Records the captures the PSP confirmed in one round, with each order's
/// `order.captured` event, in one transaction: the orders' rows locked
/// first (in id order, as every path locks them), then the payments still
/// pending re-read under lock, so a capture another worker recorded
/// meanwhile is left alone. Returns the payment ids recorded now; one
/// recorded before is not among them.
pub async fn complete_many(
    pool: &PgPool,
    captured: &[Captured],
    source: &str,
) -> Result<Vec<String>, StoreError> {
    if captured.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = captured.iter().map(|c| c.payment_id.as_str()).collect();
    let mut tx = pool.begin().await?;
    let orders: Vec<Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT order_id FROM payments WHERE payment_id = ANY($1) AND capture_state = 'pending' AND order_id IS NOT NULL",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    let found = orders::load_many_locking(&mut tx, &orders, Waiting::Wait).await?;
    let pending: HashMap<String, Uuid> = sqlx::query_as(
        "SELECT payment_id, order_id FROM payments WHERE payment_id = ANY($1) AND capture_state = 'pending' FOR UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let recorded = record_captures(&mut tx, &found, &pending, captured, source).await?;
    if recorded.is_empty() {
        return Ok(recorded);
    }
    let amounts: Vec<i64> = captured
        .iter()
        .filter(|c| recorded.contains(&c.payment_id))
        .map(|c| c.captured_minor)
        .collect();
    let ids: Vec<&str> = captured
        .iter()
        .filter(|c| recorded.contains(&c.payment_id))
        .map(|c| c.payment_id.as_str())
        .collect();
    let done = sqlx::query(
        "UPDATE payments p SET capture_state = 'captured', captured_at = now(), captured_minor = c.minor, capture_error = NULL, capture_next_attempt_at = NULL \
         FROM unnest($1::text[], $2::bigint[]) AS c(id, minor) WHERE p.payment_id = c.id AND p.capture_state = 'pending'",
    )
    .bind(&ids)
    .bind(&amounts)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != recorded.len() as u64 {
        return Err(StoreError::Corrupt(format!(
            "recording {} captures updated {} payments",
            recorded.len(),
            done.rows_affected()
        )));
    }
    tx.commit().await?;
    Ok(recorded)
}

/// Decides `order.captured` on each locked order whose payment is still
/// pending capture, onto the write path; returns those payment ids.
async fn record_captures(
    tx: &mut sqlx::PgConnection,
    found: &[domain::Order],
    pending: &HashMap<String, Uuid>,
    captured: &[Captured],
    source: &str,
) -> Result<Vec<String>, StoreError> {
    let ids: Vec<Uuid> = found.iter().map(|o| o.id).collect();
    let metas = on_order_traces(tx, source, &ids).await?;
    let by_id: HashMap<Uuid, &domain::Order> = found.iter().map(|o| (o.id, o)).collect();
    let at = crate::now();
    let mut changes = Changes::new();
    let mut recorded = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for c in captured {
        let Some(order) = pending.get(&c.payment_id).and_then(|id| by_id.get(id)) else {
            continue;
        };
        // One decision per order per transaction: a second one would be
        // decided on the order as it was before the first.
        if !seen.insert(order.id) {
            continue;
        }
        let command = Command::RecordCapture {
            payment_id: c.payment_id.clone(),
            amount_minor: c.captured_minor,
            at,
        };
        let events = domain::decide(Some(order), command).map_err(|e| {
            StoreError::Corrupt(format!("order {}: recording a capture: {e}", order.id))
        })?;
        if !events.is_empty() {
            let meta = metas
                .get(&order.id)
                .cloned()
                .unwrap_or_else(|| Metadata::spontaneous(source, order.id));
            changes.order(Some(order), &events, &meta)?;
        }
        recorded.push(c.payment_id.clone());
    }
    write::commit(tx, &changes).await?;
    Ok(recorded)
}

/// Leaves a capture for another attempt after `delay`.
pub async fn postpone(
    pool: &PgPool,
    payment_id: &str,
    delay: Duration,
    error: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payments SET capture_next_attempt_at = now() + make_interval(secs => $2), capture_leased_until = NULL, capture_error = left($3, 500) \
         WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .bind(delay.as_secs_f64())
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// The PSP cannot capture the payment (its authorization lapsed or was
/// voided elsewhere): the goods left unpaid, and a person must act. It
/// stays outstanding, and fails the audit, until then.
pub async fn refuse(pool: &PgPool, payment_id: &str, error: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payments SET capture_state = 'refused', capture_next_attempt_at = NULL, capture_error = left($2, 500) \
         WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// How many captures are owed (pending or refused), and since when the oldest.
pub async fn outstanding(pool: &PgPool) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    Ok(sqlx::query_as(
        "SELECT count(*), min(capture_decided_at) FROM payments WHERE capture_state IN ('pending', 'refused')",
    )
    .fetch_one(pool)
    .await?)
}

/// Age in seconds of the oldest authorization not captured yet (an order
/// confirmed on it whose capture is not decided: it has not shipped),
/// counted from the order's placement, at most the payment window before
/// its authorization: the index of authorized orders holds their creation
/// time, which no update moves (0 when there is none).
pub async fn oldest_authorization_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM orders WHERE authorized",
    )
    .fetch_one(pool)
    .await?)
}
