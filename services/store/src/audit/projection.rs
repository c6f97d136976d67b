//! The audit's projection check: each order's projection row against the
//! fold of its events, event streams with no row, and event ids that name
//! two events.

use super::delta::LineKey;
use super::report::AuditReport;
use crate::StoreError;
use futures::StreamExt;
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

/// Streams each projection row (of `only`, or all) beside its events, folds
/// and compares, one order at a time; then names event streams that have no
/// row. With `only`, returns the stock each order's events moved, per line.
pub(super) async fn check_projection(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
    report: &mut AuditReport,
) -> Result<BTreeMap<LineKey, [i64; 3]>, StoreError> {
    let describe = |o: &Option<domain::Order>| {
        o.as_ref()
            .map_or("nothing".into(), |o| format!("{} v{}", o.state, o.version))
    };
    let mut moved = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    {
        let mut rows = crate::orders::stream_with_history(&mut *conn, only);
        while let Some(row) = rows.next().await {
            let (row, events) = row?;
            report.orders += 1;
            report.events += events.len() as u64;
            let folded = domain::fold(&events);
            if only.is_some() {
                seen.insert(row.id);
                super::delta::movements(row.id, &events, folded.as_ref(), &mut moved);
            }
            let row = Some(row);
            if row != folded {
                let subject = row.as_ref().map(|o| o.id.to_string()).unwrap_or_default();
                let detail = format!(
                    "projection says {}, events fold to {}",
                    describe(&row),
                    describe(&folded)
                );
                report.flag("projection_drift", subject, detail);
            }
        }
    }
    let orphans: Vec<(Uuid, i64)> = match only {
        None => sqlx::query_as(
            "SELECT e.stream_id, count(*) FROM events e WHERE e.type LIKE 'order.%' \
             AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = e.stream_id) GROUP BY e.stream_id LIMIT 1000",
        )
        .fetch_all(&mut *conn)
        .await?,
        Some(ids) => {
            let unseen: Vec<Uuid> = ids.iter().filter(|id| !seen.contains(*id)).copied().collect();
            sqlx::query_as(
                "SELECT e.stream_id, count(*) FROM events e WHERE e.stream_id = ANY($1) \
                 GROUP BY e.stream_id LIMIT 1000",
            )
            .bind(unseen)
            .fetch_all(&mut *conn)
            .await?
        }
    };
    for (stream, n) in orphans {
        report.events += u64::try_from(n).unwrap_or(0);
        report.flag(
            "projection_drift",
            stream.to_string(),
            format!("{n} events but no projection row"),
        );
    }
    Ok(moved)
}

/// Event ids that name more than one event (a full pass only: it reads the
/// whole of `events`). Nothing in the database refuses them since
/// migration 29 dropped the unique index; the journal's UUIDv7s are unique
/// by construction, and a consumer would take a second event under a
/// handled id for a copy of the first.
pub(super) async fn check_event_ids(
    conn: &mut PgConnection,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let shared: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT event_id, count(*) FROM events GROUP BY event_id HAVING count(*) > 1 \
         ORDER BY event_id LIMIT 1000",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (id, n) in shared {
        report.flag(
            "duplicate_event_id",
            id.to_string(),
            format!("{n} events share this id"),
        );
    }
    Ok(())
}
