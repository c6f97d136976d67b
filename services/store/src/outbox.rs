//! Reading and clearing the outbox for the relay. Rows are never read by an
//! increasing-id cursor: each claim looks at every unpublished row, so a
//! transaction that commits late is still seen. Only the oldest unpublished
//! row of each order is claimable, so one order's events leave in the order
//! they were recorded even with N relays. A row that can never be
//! published is parked: moved to `outbox_parked` with a reason, which makes
//! the next row of its order claimable (a consumer then sees that order's
//! later events without the parked one; consumers never trust order).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// An unpublished event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: Uuid,
    /// Its place in the outbox (taken when it was written, not when it committed).
    pub position: i64,
    /// The aggregate it belongs to (the order, or the shipment).
    pub stream_id: Uuid,
    pub subject: String,
    /// The message's body exactly as written (the column is `json`: stored
    /// as written, read as text): the bytes the relay publishes.
    pub payload: String,
    pub headers: serde_json::Value,
    /// When its transaction committed (with `track_commit_timestamp = on`;
    /// otherwise when that transaction began): where the relay's
    /// commit → PubAck lag starts.
    pub created_at: DateTime<Utc>,
}

/// Server settings for the connections that claim outbox rows (the
/// relay's), so that a claim costs the same whatever the outbox's
/// statistics say.
///
/// The outbox is a queue: autovacuum often analyzes it nearly empty,
/// between two bursts, and then it fills. A claim planned on such
/// statistics (and kept as the prepared statement's generic plan) scanned
/// the whole outbox for each row it looked at, or hashed or sorted all of
/// it, or looked for each row's older rows by position with a filter on the
/// order, so each claim cost more as the backlog grew and the relay fell
/// further behind: seen as claims of 3 to 10 s with 8,000 rows waiting, and
/// in the relay bench (`soldonce bench relay`) as no row of 50,020 relayed in 120 s. With these
/// settings the only plan left walks `outbox_position` in order and looks
/// each row's order up in `outbox_stream_position`: about `limit` index
/// probes, however many rows wait. (The disabled paths are penalized rather
/// than forbidden, which would set off JIT compilation: it is off too.)
///
/// Index-only scans are off as well: when a vacuum leaves the outbox's
/// pages with no live row in them, the planner counts any later backlog as
/// one row, and a whole walk of the stream index (covering, while it held
/// the position too) then cost the same as a probe of it; with the probe
/// as an anti-join's inner side, the plan walked the whole stream index
/// once per row (16,000 rows waiting: claims of 3 s). See [`CLAIM_SQL`]
/// for the other half.
pub const CLAIM_SETTINGS: &[(&str, &str)] = &[
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_sort", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("enable_indexonlyscan", "off"),
    ("jit", "off"),
];

/// The claim, for [`claim`] and for checking its plan. `p.position + 0`
/// keeps the look-up for older rows of the same order off the position
/// index (a range over every older row, filtered by order), so it can only
/// use `outbox_stream_position`. `OFFSET 0` keeps that look-up a subquery
/// run for each row with the row's order as its key, instead of a join
/// whose inner side the planner may choose to walk whole (see
/// [`CLAIM_SETTINGS`]): planned alone, the look-up's only index path is the
/// probe by order. Each row also says whether commits wait
/// for synchronous standbys (`standbys`), so the relay knows in the same
/// round trip whether it needs [`await_replication`].
pub const CLAIM_SQL: &str = "SELECT o.id, o.position, o.stream_id, o.subject, o.payload::text AS payload, o.headers, \
        coalesce(CASE WHEN current_setting('track_commit_timestamp')::bool THEN pg_xact_commit_timestamp(o.xmin) END, o.created_at) AS created_at, \
        current_setting('synchronous_standby_names') <> '' AS standbys \
 FROM outbox o \
 WHERE NOT EXISTS (SELECT 1 FROM outbox p WHERE p.stream_id = o.stream_id AND p.position + 0 < o.position OFFSET 0) \
 ORDER BY o.position LIMIT $1 FOR UPDATE SKIP LOCKED";

/// The rows one claim locked.
#[derive(Debug, Clone, Default)]
pub struct Claimed {
    pub rows: Vec<OutboxRow>,
    /// Whether the server had synchronous standbys named when it claimed:
    /// then the relay must pass [`await_replication`] before it publishes.
    /// When none are named, no commit the claim saw waited for one, so the
    /// barrier would be a round trip that waits for nothing.
    pub needs_replication: bool,
}

#[derive(sqlx::FromRow)]
struct ClaimedRow {
    #[sqlx(flatten)]
    row: OutboxRow,
    standbys: bool,
}

/// Locks up to `limit` publishable rows for this transaction; rows other
/// relays hold are skipped. Run it on a connection opened with
/// [`CLAIM_SETTINGS`].
pub async fn claim(conn: &mut PgConnection, limit: i64) -> Result<Claimed, sqlx::Error> {
    let rows: Vec<ClaimedRow> = sqlx::query_as(CLAIM_SQL)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(Claimed {
        needs_replication: rows.iter().any(|r| r.standbys),
        rows: rows.into_iter().map(|r| r.row).collect(),
    })
}

/// Returns once everything committed before the call is on the
/// synchronous standbys ([`crate::replication::confirm`]): a commit waits
/// for them unseen, but if that wait is cancelled (`pg_cancel_backend`, a
/// pooler's timeout) PostgreSQL keeps the commit locally and shows it at
/// once, and an event published from such a row would outlive a failover
/// that loses it. The claim says whether any standby is named
/// ([`Claimed::needs_replication`]); when none is, this is not called.
pub async fn await_replication(pool: &PgPool) -> Result<(), crate::StoreError> {
    let mut conn = pool.acquire().await?;
    crate::replication::confirm(&mut conn, "relay").await
}

/// What [`delete`] did, and what it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// Rows deleted.
    pub rows: u64,
    /// Whether a row written after the batch's last one (a position past
    /// `after`) is there now: most likely new work, committed while the
    /// batch was out on the bus.
    pub newer: bool,
}

/// The relay's delete, for [`delete`] and for checking its plan.
pub const DELETE_SQL: &str = "WITH d AS (DELETE FROM outbox WHERE position = ANY($1) RETURNING 1) \
     SELECT (SELECT count(*) FROM d), \
            EXISTS (SELECT 1 FROM outbox WHERE position > $2), \
            set_config('synchronous_commit', 'off', true) IS NOT NULL";

/// Deletes published rows by position, the outbox's key and the only
/// index that holds it (`= ANY`, one probe each: see the `outbox_lean`
/// migration for why the order index does not hold it), and makes the
/// caller's transaction commit without waiting for its WAL flush
/// (`synchronous_commit = off`, for that transaction only). Nothing is
/// lost by that: a delete that a crash takes back only leaves published
/// rows in the outbox, and their republish carries the same `Nats-Msg-Id`
/// (dropped inside the stream's duplicate window; consumers dedupe by event
/// id beyond it) — the same as a relay killed between publish and delete.
/// The relay commits one such transaction per batch, about a quarter of
/// all commits under load, and the flushes it no longer waits for are
/// flushes every writer shares. The replication barrier
/// ([`await_replication`]) is its own statement and keeps the session's
/// setting.
///
/// In the same statement it looks for a row past position `after` (the
/// batch's last), so that the relay claims again at once only when there
/// is likely something to claim: a claim that finds nothing costs a
/// transaction (`BEGIN`, the claim, `ROLLBACK`).
pub async fn delete(
    conn: &mut PgConnection,
    positions: &[i64],
    after: i64,
) -> Result<Deleted, sqlx::Error> {
    let (deleted, newer): (i64, bool) = sqlx::query_as(DELETE_SQL)
        .bind(positions)
        .bind(after)
        .fetch_one(conn)
        .await?;
    Ok(Deleted {
        rows: u64::try_from(deleted).unwrap_or(0),
        newer,
    })
}

/// Moves rows that can never be published, each named by its position
/// with its short reason (`too_large`, `bad_subject`, `rejected`), from
/// `outbox` to `outbox_parked` in one statement, in the caller's
/// transaction (the one that claimed them). Returns how many moved. A row
/// parked again (an operator re-inserted it and it still fails) replaces
/// its old record.
pub async fn park(conn: &mut PgConnection, rows: &[(i64, &str)]) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let positions: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.1).collect();
    let moved = sqlx::query(
        "WITH moved AS ( \
             DELETE FROM outbox WHERE position = ANY($1) \
             RETURNING id, position, stream_id, subject, payload, headers, created_at) \
         INSERT INTO outbox_parked (id, position, stream_id, subject, payload, headers, created_at, reason) \
         SELECT m.id, m.position, m.stream_id, m.subject, m.payload, m.headers, m.created_at, p.reason \
         FROM moved m JOIN unnest($1::bigint[], $2::text[]) AS p(position, reason) ON p.position = m.position \
         ON CONFLICT (id) DO UPDATE SET position = EXCLUDED.position, stream_id = EXCLUDED.stream_id, \
             subject = EXCLUDED.subject, payload = EXCLUDED.payload, headers = EXCLUDED.headers, \
             created_at = EXCLUDED.created_at, reason = EXCLUDED.reason, parked_at = now()",
    )
    .bind(&positions)
    .bind(&reasons)
    .execute(conn)
    .await?;
    Ok(moved.rows_affected())
}

/// How many rows are parked (the `soldonce_outbox_parked` gauge).
pub async fn parked(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_parked")
        .fetch_one(pool)
        .await?;
    Ok(n)
}

/// A row the relay set aside, for an operator to read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ParkedRow {
    /// The event's id (its `Nats-Msg-Id`).
    pub id: Uuid,
    /// The event's position in `events`.
    pub position: i64,
    /// The aggregate it belongs to (the order, or the shipment).
    pub stream_id: Uuid,
    pub subject: String,
    /// `too_large`, `bad_subject` or `rejected`.
    pub reason: String,
    /// The message's size in bytes.
    pub bytes: i32,
    pub parked_at: DateTime<Utc>,
}

/// The parked rows, oldest first, at most `limit`.
pub async fn parked_rows(pool: &PgPool, limit: i64) -> Result<Vec<ParkedRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, position, stream_id, subject, reason, octet_length(payload::text) AS bytes, parked_at \
         FROM outbox_parked ORDER BY parked_at, position LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Which of `ids` are parked, and which of the others are events at all:
/// `(parked, known events not parked)`; an id in neither is unknown.
pub async fn classify_ids(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<(Vec<Uuid>, Vec<Uuid>), sqlx::Error> {
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT k.id, EXISTS (SELECT 1 FROM outbox_parked p WHERE p.id = k.id) \
         FROM unnest($1::uuid[]) AS k(id) \
         WHERE EXISTS (SELECT 1 FROM outbox_parked p WHERE p.id = k.id) \
            OR EXISTS (SELECT 1 FROM events e WHERE e.event_id = k.id)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    let (parked, known): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(_, parked)| *parked);
    Ok((
        parked.into_iter().map(|(id, _)| id).collect(),
        known.into_iter().map(|(id, _)| id).collect(),
    ))
}

/// Moves parked rows (those of `ids`, or all with `None`) back into the
/// outbox in one statement, each with its old position, so it leaves
/// before any later row of its order still waiting; the insert wakes the
/// relay. Its `created_at` is now: the requeue is the commit it is
/// published after. A row already moved by another requeue is not there to
/// move again. Returns the ids moved; with `dry_run` nothing moves (the
/// ids that would).
pub async fn requeue(
    pool: &PgPool,
    ids: Option<&[Uuid]>,
    dry_run: bool,
) -> Result<Vec<Uuid>, sqlx::Error> {
    if dry_run {
        return sqlx::query_scalar(
            "SELECT id FROM outbox_parked WHERE $1::uuid[] IS NULL OR id = ANY($1) ORDER BY position",
        )
        .bind(ids)
        .fetch_all(pool)
        .await;
    }
    sqlx::query_scalar(
        "WITH moved AS ( \
             DELETE FROM outbox_parked WHERE $1::uuid[] IS NULL OR id = ANY($1) \
             RETURNING id, position, stream_id, subject, payload, headers) \
         INSERT INTO outbox (id, position, stream_id, subject, payload, headers, created_at) \
         SELECT id, position, stream_id, subject, payload, headers, now() FROM moved ORDER BY position \
         RETURNING id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
}

/// Holds the relay's wake-up for `ahead`: moves the `outbox_wake` trigger's
/// bucket (200 per second, see its migration) that far ahead, never back,
/// so writers committing until then send no notification. The relay that
/// holds it looks for rows itself until then.
///
/// The move is a hint, not data, so it commits as [`delete`] does
/// (`synchronous_commit = off` for this one statement): lost in a crash or
/// a failover, it costs writers a few notifications, whereas waiting for
/// its flush, or for a synchronous standby that is away, would stall the
/// relay's loop behind a statement that protects nothing.
pub async fn hold_wake(pool: &PgPool, ahead: std::time::Duration) -> Result<(), sqlx::Error> {
    sqlx::query(
        "SELECT set_config('synchronous_commit', 'off', true), setval('outbox_wake_bucket', greatest((SELECT last_value FROM outbox_wake_bucket), floor(extract(epoch FROM clock_timestamp() + make_interval(secs => $1)) * 200)::bigint))",
    )
    .bind(ahead.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether this connection's role may `VACUUM` the outbox: its owner (or a
/// member of the owning role), the database's owner, or a superuser.
/// Anyone else's `VACUUM` is skipped by the server with a warning.
pub async fn can_vacuum(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT pg_has_role(current_user, c.relowner, 'MEMBER') \
             OR pg_has_role(current_user, d.datdba, 'MEMBER') \
             OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) \
         FROM pg_class c, pg_database d \
         WHERE c.oid = 'outbox'::regclass AND d.datname = current_database()",
    )
    .fetch_one(pool)
    .await
}

/// Vacuums the outbox: the index entries of deleted rows go, so a claim's
/// walk from the oldest position starts at the first live row again.
///
/// The outbox is a queue: every row is deleted soon after it is written,
/// and the claim walks `outbox_position` from its start. Until a vacuum
/// removes them, the entries of deleted rows stay at that start, and every
/// claim steps over them (each one a heap visit until a scan has marked it
/// dead). Autovacuum looks at a database once per `autovacuum_naptime`
/// (1 minute by default); at 1,000 orders/s the outbox takes about 6,000
/// deleted rows a second, 90,000 over a 25 s benchmark run, in which it
/// was never vacuumed, and the claims' cost grew with them.
///
/// `SKIP_LOCKED`: if another relay or autovacuum is vacuuming it, this
/// call does nothing. `TRUNCATE false`: never shrink the file, which would
/// take a lock every writer queues behind (a queue's file is refilled at
/// once anyway). `INDEX_CLEANUP ON`: the index entries are what is wanted
/// gone. Not in a transaction (`VACUUM` cannot run in one).
pub async fn vacuum(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("VACUUM (SKIP_LOCKED, TRUNCATE false, INDEX_CLEANUP ON) outbox")
        .execute(pool)
        .await
        .map(|_| ())
}

/// How many rows wait, and how old the oldest is in seconds.
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox",
    )
    .fetch_one(pool)
    .await
}
