//! Findings: facts soldonce cannot settle itself and names to a person (a
//! dispute: answer it at the PSP; a refund made outside soldonce). Each stays in the audit until a person
//! acknowledges it; acknowledging releases nothing unless asked to (a held
//! shipment stays held: shipping disputed goods is a person's decision).

use crate::StoreError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Finding {
    pub id: i64,
    pub kind: String,
    pub order_id: Option<Uuid>,
    /// What it is about, unique per kind (a dispute: its id).
    pub subject: String,
    pub detail: String,
    pub created_at: DateTime<Utc>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub acknowledged_by: Option<String>,
    pub note: Option<String>,
    /// The order's shipment is held (by a dispute) and not released.
    pub shipment_held: bool,
}

/// Opens a finding in the caller's transaction; a second one of the same
/// kind and subject is the first (its id).
pub(crate) async fn open(
    conn: &mut PgConnection,
    kind: &str,
    order_id: Uuid,
    subject: &str,
    detail: &str,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "WITH new AS (INSERT INTO findings (kind, order_id, subject, detail) VALUES ($1, $2, $3, $4) \
                      ON CONFLICT ON CONSTRAINT findings_once DO NOTHING RETURNING id) \
         SELECT id FROM new UNION ALL SELECT id FROM findings WHERE kind = $1 AND subject = $3 LIMIT 1",
    )
    .bind(kind)
    .bind(order_id)
    .bind(subject)
    .bind(detail)
    .fetch_one(conn)
    .await?)
}

const SELECT: &str = "SELECT f.id, f.kind, f.order_id, f.subject, f.detail, f.created_at, f.acknowledged_at, \
        f.acknowledged_by, f.note, \
        EXISTS (SELECT 1 FROM shipment_holds h WHERE h.order_id = f.order_id AND h.released_at IS NULL) AS shipment_held \
     FROM findings f";

/// The findings not acknowledged yet (with `all`, every one), oldest first.
pub async fn list(pool: &PgPool, all: bool, limit: i64) -> Result<Vec<Finding>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "{SELECT} WHERE $1 OR f.acknowledged_at IS NULL ORDER BY f.id LIMIT $2"
    ))
    .bind(all)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// What became of an acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acked {
    /// Acknowledged now; `released`: the order's shipment hold was released.
    Done {
        finding: Finding,
        released: bool,
    },
    /// Acknowledged before: nothing changed.
    Already(Finding),
    NotFound,
}

/// Acknowledges finding `id` for `by`; with `release`, also releases the
/// hold on its order's shipment (fulfillment then ships it), also on a
/// finding acknowledged before. One transaction.
pub async fn acknowledge(
    pool: &PgPool,
    id: i64,
    by: &str,
    note: Option<&str>,
    release: bool,
) -> Result<Acked, StoreError> {
    let mut tx = pool.begin().await?;
    let found: Option<Finding> =
        sqlx::query_as(&format!("{SELECT} WHERE f.id = $1 FOR UPDATE OF f"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(finding) = found else {
        return Ok(Acked::NotFound);
    };
    if finding.acknowledged_at.is_some() {
        // Acknowledged before: only a hold still in place may be released now.
        let released = release && release_hold(&mut tx, &finding, by).await?;
        let shipment_held = still_held(&mut tx, finding.order_id).await?;
        tx.commit().await?;
        return Ok(match released {
            true => Acked::Done {
                finding: Finding {
                    shipment_held,
                    ..finding
                },
                released,
            },
            false => Acked::Already(finding),
        });
    }
    let finding: Finding = sqlx::query_as(
        "WITH done AS (UPDATE findings SET acknowledged_at = now(), acknowledged_by = $2, note = $3 \
                       WHERE id = $1 RETURNING *) \
         SELECT f.id, f.kind, f.order_id, f.subject, f.detail, f.created_at, f.acknowledged_at, f.acknowledged_by, f.note, \
                false AS shipment_held FROM done f",
    )
    .bind(id)
    .bind(by)
    .bind(note)
    .fetch_one(&mut *tx)
    .await?;
    let released = release && release_hold(&mut tx, &finding, by).await?;
    let shipment_held = still_held(&mut tx, finding.order_id).await?;
    tx.commit().await?;
    Ok(Acked::Done {
        finding: Finding {
            shipment_held,
            ..finding
        },
        released,
    })
}

/// Releases the hold the finding's dispute (its subject) put on its
/// order's shipment, if it is in place; another dispute's stays.
async fn release_hold(
    conn: &mut PgConnection,
    finding: &Finding,
    by: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE shipment_holds SET released_at = now(), released_by = $3 \
         WHERE order_id = $1 AND dispute_id = $2 AND released_at IS NULL",
    )
    .bind(finding.order_id)
    .bind(&finding.subject)
    .bind(by)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Whether any hold on `order`'s shipment still stands.
async fn still_held(conn: &mut PgConnection, order: Option<Uuid>) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM shipment_holds h WHERE h.order_id = $1 AND h.released_at IS NULL)",
    )
    .bind(order)
    .fetch_one(conn)
    .await?)
}

/// Open findings by kind, and shipments held now: for the gauges.
pub async fn open_counts(pool: &PgPool) -> Result<(Vec<(String, i64)>, i64), StoreError> {
    let open: Vec<(String, i64)> = sqlx::query_as(
        "SELECT k, count(f.id) FROM (VALUES ('dispute'), ('refund_elsewhere')) AS kinds(k) \
         LEFT JOIN findings f ON f.kind = k AND f.acknowledged_at IS NULL GROUP BY k ORDER BY k",
    )
    .fetch_all(pool)
    .await?;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shipment_holds WHERE released_at IS NULL")
            .fetch_one(pool)
            .await?;
    Ok((open, held))
}

/// Every finding not acknowledged (id, kind, order, subject, detail),
/// oldest first, at most 1000: what the audit names.
pub(crate) async fn open_unacknowledged(
    conn: &mut PgConnection,
) -> Result<Vec<(i64, String, Option<Uuid>, String, String)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, kind, order_id, subject, detail FROM findings WHERE acknowledged_at IS NULL ORDER BY id LIMIT 1000",
    )
    .fetch_all(&mut *conn)
    .await?)
}
