//! The incremental audit's bookkeeping: where the last recorded run stopped
//! (`audit_checkpoint`: frontiers over `events` and `stock_ledger`, and each
//! SKU's ledger sums in that run's snapshot), reading what came after it,
//! and the per-order check that stands in for the full pass's per-SKU sums
//! over every order: each changed order's ledger rows are exactly the
//! movements its events cause. With the buckets equal to the ledger sums
//! (checked for every SKU each run), the two together imply the full pass's
//! `reserved`/`sold` equalities without reading the orders that did not
//! change.

use super::frontier::Frontier;
use super::report::{AuditKind, AuditOptions, AuditReport};
use crate::StoreError;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use uuid::Uuid;

/// At most this many unseen sequence numbers are kept (the newest); more
/// than that many transactions in flight at once does not happen, and a
/// flood of rollbacks only costs the oldest holes their second look.
const MAX_HOLES: usize = 100_000;

/// An order's line: (order, SKU).
pub(crate) type LineKey = (Uuid, String);

/// Where a run leaves the next one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checkpoint {
    /// The stored version it was loaded at (`None`: not loaded).
    pub version: Option<i64>,
    pub events: Frontier,
    pub ledger: Frontier,
    /// Each SKU's ledger sums (available, reserved, sold) up to `ledger`.
    pub sums: BTreeMap<String, [i64; 3]>,
    /// The SKUs whose sums moved since the loaded version (`None`: all).
    pub changed_skus: Option<BTreeSet<String>>,
}

/// The stored checkpoint, if any, read consistently.
pub(crate) async fn load(pool: &PgPool) -> Result<Option<Checkpoint>, StoreError> {
    type Row = (
        i64,
        i64,
        Vec<i64>,
        Vec<DateTime<Utc>>,
        i64,
        Vec<i64>,
        Vec<DateTime<Utc>>,
    );
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let row: Option<Row> = sqlx::query_as(
        "SELECT version, event_position, event_gaps, event_gaps_seen, ledger_id, ledger_gaps, ledger_gaps_seen FROM audit_checkpoint",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some((version, ep, eg, egs, lp, lg, lgs)) = row else {
        return Ok(None);
    };
    let sums: Vec<(String, i64, i64, i64)> =
        sqlx::query_as("SELECT sku, available, reserved, sold FROM audit_ledger_sums")
            .fetch_all(&mut *tx)
            .await?;
    tx.rollback().await?;
    Ok(Some(Checkpoint {
        version: Some(version),
        events: Frontier {
            upto: ep,
            holes: eg.into_iter().zip(egs).collect(),
        },
        ledger: Frontier {
            upto: lp,
            holes: lg.into_iter().zip(lgs).collect(),
        },
        sums: sums
            .into_iter()
            .map(|(sku, a, r, s)| (sku, [a, r, s]))
            .collect(),
        changed_skus: Some(BTreeSet::new()),
    }))
}

/// The checkpoint a full pass leaves: `sums` as it read them, everything up
/// to the highest numbers, holes only among rows recorded within the
/// patience (older holes are rollbacks).
pub(crate) async fn of_full_pass(
    conn: &mut PgConnection,
    options: &AuditOptions,
    sums: BTreeMap<String, [i64; 3]>,
) -> Result<Checkpoint, StoreError> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await?;
    let patience = options.hole_patience.as_secs_f64();
    let events = full_frontier(conn, "events", "position", patience, now).await?;
    let ledger = full_frontier(conn, "stock_ledger", "id", patience, now).await?;
    Ok(Checkpoint {
        version: None,
        events,
        ledger,
        sums,
        changed_skus: None,
    })
}

async fn full_frontier(
    conn: &mut PgConnection,
    table: &str,
    number: &str,
    patience_seconds: f64,
    now: DateTime<Utc>,
) -> Result<Frontier, StoreError> {
    let sql = format!(
        "SELECT coalesce((SELECT max({number}) FROM {table}), 0), \
         coalesce((SELECT array_agg({number}) FROM {table} WHERE recorded_at >= now() - make_interval(secs => $1)), '{{}}')"
    );
    let (max, mut recent): (i64, Vec<i64>) = sqlx::query_as(&sql)
        .bind(patience_seconds)
        .fetch_one(conn)
        .await?;
    let from = recent.iter().min().map_or(max, |m| m - 1);
    Ok(Frontier::of_full_read(max, &mut recent, from, now))
}

/// Reads every event and ledger row past `base` (and in its holes), checks
/// each SKU's buckets against `base`'s sums plus the new ledger rows, and
/// returns the checkpoint this snapshot makes with the orders that have new
/// events or new ledger rows.
pub(crate) async fn advance(
    conn: &mut PgConnection,
    options: &AuditOptions,
    base: &Checkpoint,
    now: DateTime<Utc>,
    report: &mut AuditReport,
) -> Result<(Checkpoint, Vec<Uuid>), StoreError> {
    let mut changed = HashSet::new();
    let mut positions = read_new_events(conn, &base.events, &mut changed).await?;
    let mut sums = base.sums.clone();
    let mut changed_skus = base.changed_skus.clone();
    let mut ids = read_new_ledger(
        conn,
        &base.ledger,
        &mut changed,
        &mut sums,
        &mut changed_skus,
    )
    .await?;
    check_buckets(conn, &sums, report).await?;
    let patience = options.hole_patience;
    let checkpoint = Checkpoint {
        version: base.version,
        events: bounded(base.events.advance(&mut positions, now, patience)),
        ledger: bounded(base.ledger.advance(&mut ids, now, patience)),
        sums,
        changed_skus,
    };
    let mut changed: Vec<Uuid> = changed.into_iter().collect();
    changed.sort_unstable();
    Ok((checkpoint, changed))
}

/// The positions of the events past `frontier` (and in its holes); each
/// order with one of them goes into `changed`.
async fn read_new_events(
    conn: &mut PgConnection,
    frontier: &Frontier,
    changed: &mut HashSet<Uuid>,
) -> Result<Vec<i64>, StoreError> {
    let mut positions = vec![];
    let mut rows = sqlx::query_as::<_, (i64, Uuid, bool)>(
        "SELECT position, stream_id, type LIKE 'order.%' FROM events WHERE position > $1 OR position = ANY($2)",
    )
    .bind(frontier.upto)
    .bind(frontier.hole_numbers())
    .fetch(&mut *conn);
    while let Some(row) = rows.next().await {
        let (position, stream, is_order) = row?;
        positions.push(position);
        if is_order {
            changed.insert(stream);
        }
    }
    Ok(positions)
}

/// The ids of the ledger rows past `frontier` (and in its holes), each
/// added to its SKU's `sums` (the SKU into `changed_skus`) and its order
/// into `changed`.
async fn read_new_ledger(
    conn: &mut PgConnection,
    frontier: &Frontier,
    changed: &mut HashSet<Uuid>,
    sums: &mut BTreeMap<String, [i64; 3]>,
    changed_skus: &mut Option<BTreeSet<String>>,
) -> Result<Vec<i64>, StoreError> {
    let mut ids = vec![];
    let mut rows = sqlx::query_as::<_, (i64, String, i64, i64, i64, Option<Uuid>)>(
        "SELECT id, sku, d_available, d_reserved, d_sold, order_id FROM stock_ledger WHERE id > $1 OR id = ANY($2)",
    )
    .bind(frontier.upto)
    .bind(frontier.hole_numbers())
    .fetch(&mut *conn);
    while let Some(row) = rows.next().await {
        let (id, sku, a, r, s, order) = row?;
        ids.push(id);
        // An order with new ledger rows is checked even without new events.
        changed.extend(order);
        let sum = sums.entry(sku.clone()).or_insert([0; 3]);
        sum[0] += a;
        sum[1] += r;
        sum[2] += s;
        if let Some(skus) = changed_skus.as_mut() {
            skus.insert(sku);
        }
    }
    Ok(ids)
}

/// Flags each SKU whose buckets differ from its ledger `sums` (`ledger_drift`).
async fn check_buckets(
    conn: &mut PgConnection,
    sums: &BTreeMap<String, [i64; 3]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let buckets: Vec<(String, i64, i64, i64)> =
        sqlx::query_as("SELECT sku, available, reserved, sold FROM stock_buckets ORDER BY sku")
            .fetch_all(&mut *conn)
            .await?;
    for (sku, a, r, s) in buckets {
        report.skus += 1;
        let [la, lr, ls] = sums.get(&sku).copied().unwrap_or([0; 3]);
        if (a, r, s) != (la, lr, ls) {
            report.flag(
                "ledger_drift",
                sku,
                format!(
                    "buckets available {a} reserved {r} sold {s}, ledger says {la} / {lr} / {ls}"
                ),
            );
        }
    }
    Ok(())
}

/// `f` with at most [`MAX_HOLES`] holes, the newest kept.
fn bounded(mut f: Frontier) -> Frontier {
    if f.holes.len() > MAX_HOLES {
        f.holes.sort_by_key(|h| std::cmp::Reverse(h.1));
        f.holes.truncate(MAX_HOLES);
        f.holes.sort_unstable();
    }
    f
}

/// Adds the stock each of an order's events moves, per line, to `moved`.
pub(crate) fn movements(
    order: Uuid,
    events: &[domain::Event],
    folded: Option<&domain::Order>,
    moved: &mut BTreeMap<LineKey, [i64; 3]>,
) {
    let Some(folded) = folded else { return };
    for movement in events.iter().filter_map(|e| e.movement()) {
        for line in &folded.lines {
            let d = movement.delta(line.quantity.get());
            let m = moved
                .entry((order, line.sku.as_str().to_owned()))
                .or_insert([0; 3]);
            m[0] += d.available;
            m[1] += d.reserved;
            m[2] += d.sold;
        }
    }
}

/// Each order's ledger rows, per SKU, against the movements its events cause.
pub(crate) async fn check_order_ledgers(
    conn: &mut PgConnection,
    orders: &[Uuid],
    mut expected: BTreeMap<LineKey, [i64; 3]>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let rows: Vec<(Uuid, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT order_id, sku, sum(d_available)::bigint, sum(d_reserved)::bigint, sum(d_sold)::bigint \
         FROM stock_ledger WHERE order_id = ANY($1) GROUP BY order_id, sku ORDER BY order_id, sku",
    )
    .bind(orders)
    .fetch_all(&mut *conn)
    .await?;
    let mut ledgered: BTreeMap<LineKey, [i64; 3]> = rows
        .into_iter()
        .map(|(o, sku, a, r, s)| ((o, sku), [a, r, s]))
        .collect();
    let keys: BTreeSet<LineKey> = expected.keys().chain(ledgered.keys()).cloned().collect();
    for key in keys {
        let want = expected.remove(&key).unwrap_or([0; 3]);
        let got = ledgered.remove(&key).unwrap_or([0; 3]);
        if want != got {
            let (order, sku) = key;
            report.flag(
                "order_ledger_drift",
                order.to_string(),
                format!(
                    "{sku}: the ledger moved {} / {} / {} (available / reserved / sold), its events move {} / {} / {}",
                    got[0], got[1], got[2], want[0], want[1], want[2]
                ),
            );
        }
    }
    Ok(())
}

/// Stores `checkpoint` unless another run moved the stored one since it was
/// loaded (a full pass always stores). Whether it was stored.
pub(crate) async fn save(
    conn: &mut PgConnection,
    kind: AuditKind,
    checkpoint: &Checkpoint,
    at: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let (ev, lg) = (&checkpoint.events, &checkpoint.ledger);
    let seen = |f: &Frontier| f.holes.iter().map(|h| h.1).collect::<Vec<_>>();
    let columns = "version, at, event_position, event_gaps, event_gaps_seen, ledger_id, ledger_gaps, ledger_gaps_seen";
    let sql = match (kind, checkpoint.version) {
        (AuditKind::Full, _) | (AuditKind::Incremental, None) => format!(
            "INSERT INTO audit_checkpoint ({columns}) VALUES (1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO UPDATE SET version = audit_checkpoint.version + 1, at = $2, event_position = $3, \
             event_gaps = $4, event_gaps_seen = $5, ledger_id = $6, ledger_gaps = $7, ledger_gaps_seen = $8 \
             WHERE $1::bigint IS NULL OR audit_checkpoint.version = $1"
        ),
        (AuditKind::Incremental, Some(_)) => "UPDATE audit_checkpoint SET version = version + 1, at = $2, event_position = $3, \
             event_gaps = $4, event_gaps_seen = $5, ledger_id = $6, ledger_gaps = $7, ledger_gaps_seen = $8 WHERE version = $1"
            .to_owned(),
    };
    let version = match kind {
        AuditKind::Full => None,
        AuditKind::Incremental => checkpoint.version,
    };
    let stored = sqlx::query(&sql)
        .bind(version)
        .bind(at)
        .bind(ev.upto)
        .bind(ev.hole_numbers())
        .bind(seen(ev))
        .bind(lg.upto)
        .bind(lg.hole_numbers())
        .bind(seen(lg))
        .execute(&mut *conn)
        .await?
        .rows_affected()
        == 1;
    if !stored {
        return Ok(false);
    }
    let write: Vec<(&String, &[i64; 3])> = match &checkpoint.changed_skus {
        None => {
            sqlx::query("DELETE FROM audit_ledger_sums")
                .execute(&mut *conn)
                .await?;
            checkpoint.sums.iter().collect()
        }
        Some(skus) => skus
            .iter()
            .filter_map(|s| checkpoint.sums.get_key_value(s))
            .collect(),
    };
    if !write.is_empty() {
        let skus: Vec<&str> = write.iter().map(|w| w.0.as_str()).collect();
        let column = |i: usize| write.iter().map(|w| w.1[i]).collect::<Vec<i64>>();
        sqlx::query(
            "INSERT INTO audit_ledger_sums (sku, available, reserved, sold) \
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) \
             ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, reserved = EXCLUDED.reserved, sold = EXCLUDED.sold",
        )
        .bind(skus)
        .bind(column(0))
        .bind(column(1))
        .bind(column(2))
        .execute(&mut *conn)
        .await?;
    }
    Ok(true)
}
