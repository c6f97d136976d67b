//! Recorded audits (`audit_runs`): each run's kind, snapshot time, duration,
//! counts and violations, so the console and operators see the last one
//! without running another, and the incremental audit knows when the last
//! full pass was. Runs older than [`KEEP_DAYS`] are purged as runs are added.

use super::delta::Checkpoint;
use super::report::{AuditKind, AuditReport};
use crate::StoreError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;

/// Recorded runs are kept this many days.
pub const KEEP_DAYS: i32 = 30;
/// Violations listed in a recorded run; the rest are counted by check.
const LISTED: usize = 50;

/// A recorded run, as the console and `soldonce audit --last` show it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RecordedAudit {
    pub kind: String,
    pub started_at: DateTime<Utc>,
    pub seconds: f64,
    pub from_position: Option<i64>,
    pub to_position: i64,
    pub orders: i64,
    pub events: i64,
    pub violation_count: i64,
    /// Violations by check.
    #[sqlx(json)]
    pub checks: BTreeMap<String, u64>,
    /// The first violations, each `{check, subject, detail}`.
    pub violations: serde_json::Value,
}

/// An audit done, to be [recorded](Audit::record).
#[derive(Debug)]
pub struct Audit {
    pub report: AuditReport,
    pub(crate) started_at: chrono::DateTime<chrono::Utc>,
    pub(crate) seconds: f64,
    /// Where this run leaves the next incremental one.
    pub(crate) checkpoint: Checkpoint,
}

impl Audit {
    /// Records the run and, unless another run stored a newer one since
    /// this one began, the checkpoint the next incremental run starts from.
    pub async fn record(&self, pool: &PgPool) -> Result<(), StoreError> {
        let report = &self.report;
        let mut checks: BTreeMap<&str, u64> = BTreeMap::new();
        for v in &report.violations {
            *checks.entry(v.check).or_insert(0) += 1;
        }
        let listed = &report.violations[..report.violations.len().min(LISTED)];
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO audit_runs (kind, started_at, seconds, from_position, to_position, orders, events, violation_count, checks, violations) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(report.kind.as_str())
        .bind(self.started_at)
        .bind(self.seconds)
        .bind(report.from_position)
        .bind(report.to_position)
        .bind(i64::try_from(report.orders).unwrap_or(i64::MAX))
        .bind(i64::try_from(report.events).unwrap_or(i64::MAX))
        .bind(i64::try_from(report.violation_count).unwrap_or(i64::MAX))
        .bind(sqlx::types::Json(&checks))
        .bind(sqlx::types::Json(listed))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM audit_runs WHERE started_at < now() - make_interval(days => $1)")
            .bind(KEEP_DAYS)
            .execute(&mut *tx)
            .await?;
        let stored =
            super::delta::save(&mut tx, report.kind, &self.checkpoint, self.started_at).await?;
        if !stored {
            tracing::debug!("another audit stored a newer checkpoint; this run's is dropped");
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The last recorded run, if any.
pub async fn last(pool: &PgPool) -> Result<Option<RecordedAudit>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT kind, started_at, seconds, from_position, to_position, orders, events, violation_count, checks, violations \
         FROM audit_runs ORDER BY started_at DESC, id DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await?)
}

/// Whether the last recorded full pass is older than `every` (or missing).
pub(crate) async fn full_pass_due(pool: &PgPool, every: Duration) -> Result<bool, StoreError> {
    let kind = AuditKind::Full.as_str();
    Ok(sqlx::query_scalar::<_, bool>(
        "SELECT coalesce(max(started_at) < now() - make_interval(secs => $2), true) FROM audit_runs WHERE kind = $1",
    )
    .bind(kind)
    .bind(every.as_secs_f64())
    .fetch_one(pool)
    .await?)
}
