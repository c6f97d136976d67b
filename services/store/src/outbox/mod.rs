//! Reading and clearing the outbox for the relay. An outbox row names the
//! events one statement appended, by position (`positions`; its key is the
//! first of them); the claim reads each event and builds its message (each
//! event is written once, in `events`). Rows are never read by an
//! increasing-id cursor: each claim looks at every unpublished row, so a
//! transaction that commits late is still seen. A row is claimable only
//! when no event of it waits behind an older event of its order in another
//! row, so one order's events leave in the order they were recorded even
//! with N relays. An event that can never be published is parked: set
//! aside in `outbox_parked` with a reason, which makes the next events of
//! its order claimable (a consumer then sees that order's later events
//! without the parked one; consumers never trust order).

use crate::stream_copy::{event_columns, EventMessage, StoredEvent};
use crate::StoreError;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

mod parked;
pub use parked::{classify_ids, park, parked, parked_rows, requeue, ParkedRow, Requeued};

/// An unpublished event, with the message the relay publishes for it,
/// built from its row in `events`, and the outbox row that holds it.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// The message, as a repair would rebuild it.
    pub message: EventMessage,
    /// The key of the outbox row that holds the event (the first position
    /// among that row's events): what the relay deletes once every event of
    /// the row is settled.
    pub row: i64,
    /// The aggregate it belongs to (the order, or the shipment).
    pub stream_id: Uuid,
    /// When its transaction committed (with `track_commit_timestamp = on`;
    /// otherwise when that transaction began): where the relay's
    /// commit → PubAck lag starts.
    pub created_at: DateTime<Utc>,
}

impl OutboxRow {
    /// The row of a claimed event, its message built as a repair builds it.
    fn of(row: ClaimedRow) -> Result<OutboxRow, StoreError> {
        let stream_id = row.event.stream_id;
        Ok(OutboxRow {
            message: row.event.message()?,
            row: row.outbox_row,
            stream_id,
            created_at: row.created_at,
        })
    }

    /// The trace headers as a parked row keeps them.
    fn headers(&self) -> serde_json::Value {
        let mut h = serde_json::Map::new();
        if let Some(t) = &self.message.traceparent {
            h.insert("traceparent".into(), t.as_str().into());
        }
        if let Some(t) = &self.message.tracestate {
            h.insert("tracestate".into(), t.as_str().into());
        }
        h.into()
    }
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
/// up, for each row, whether the version before its event waits (three
/// probes of keys, see [`CLAIM_SQL`]): a few index probes per row claimed,
/// however many rows wait. (The disabled paths are penalized rather
/// than forbidden, which would set off JIT compilation: it is off too.)
///
/// Index-only scans are off as well: when a vacuum leaves the outbox's
/// pages with no live row in them, the planner counts any later backlog as
/// one row, and a whole walk of an index then costs the same as a probe of
/// it; with such a walk as an anti-join's inner side, an earlier claim
/// walked a whole index of the outbox once per row (16,000 rows waiting:
/// claims of 3 s). See [`CLAIM_SQL`] for the other half.
pub const CLAIM_SETTINGS: &[(&str, &str)] = &[
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_sort", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("enable_indexonlyscan", "off"),
    ("jit", "off"),
];

/// The claim, for [`claim`] and for checking its plan. It walks the
/// outbox in key order (a row's first position) and locks up to `$1` rows;
/// it then reads each of their events by position (one probe of
/// `events_pkey` each, never a walk of `events`) and returns one row per
/// event, with its outbox row's key (`outbox_row`), in no particular
/// order; [`claim`] sorts them by position.
///
/// A row is claimable when no event of it has the event just before it in
/// its stream waiting in another row: a stream's versions are contiguous,
/// and each is written only once the one before it has committed, so an
/// older event of the same order waits exactly when that one does (an
/// operator's requeue of an old event is the exception: it goes out
/// beside, not before, what of its order waits already). The look-up, for
/// each event of the row, is three probes of keys, each a subquery fenced
/// with `OFFSET 0` and fed by the one before it, so no plan can walk a
/// table instead (see [`CLAIM_SETTINGS`]): the event
/// (`events_pkey`; only events past their stream's first go on), the
/// version before it (`events_stream_version`, the key every append
/// already writes), and the rows of the transaction that wrote that one
/// (`outbox_tx`, by its `xmin`), of which the one that lists its position
/// holds it back. An event of the same row is no hold: the relay publishes
/// a row's events of one order in position order, each once the one before
/// is acknowledged, and the write path appends each order's events in
/// version order, so positions follow versions.
///
/// Each row also says whether commits wait for synchronous standbys
/// (`standbys`), so the relay knows in the same round trip whether it
/// needs [`await_replication`]. Keys in `$2` are left out before any
/// look-up: the rows the relay's other lanes hold, which `SKIP LOCKED`
/// would only skip once their probes were made (a lane's empty claims
/// walked the other lane's whole batch so).
pub const CLAIM_SQL: &str = concat!(
    "WITH claimed AS MATERIALIZED ( \
         SELECT o.position AS outbox_row, o.positions, \
                coalesce(CASE WHEN current_setting('track_commit_timestamp')::bool THEN pg_xact_commit_timestamp(o.xmin) END, o.created_at) AS created_at \
         FROM outbox o \
         WHERE o.position <> ALL($2::bigint[]) AND NOT EXISTS ( \
             SELECT 1 \
             FROM unnest(o.positions) AS p(position), \
                  LATERAL (SELECT e.stream_id, e.version FROM events e WHERE e.position = p.position AND e.version > 1 OFFSET 0) e, \
                  LATERAL (SELECT b.position, b.xmin::text::bigint AS tx FROM events b WHERE b.stream_id = e.stream_id AND b.version = e.version - 1 OFFSET 0) b, \
                  LATERAL (SELECT 1 FROM outbox w WHERE w.tx = b.tx AND b.position = ANY(w.positions) AND w.position <> o.position OFFSET 0) w) \
         ORDER BY o.position LIMIT $1 FOR UPDATE OF o SKIP LOCKED) \
     SELECT ",
    event_columns!(),
    ", c.outbox_row, c.created_at, current_setting('synchronous_standby_names') <> '' AS standbys \
     FROM claimed c, LATERAL (SELECT * FROM events e WHERE e.position = ANY(c.positions) OFFSET 0) e"
);

/// [`EVENTS_PER_ROW`] as a literal, for [`QUEUE_SQL`]'s `concat!`.
macro_rules! events_per_row {
    () => {
        32
    };
}

/// The most events one outbox row holds. A statement that appends more
/// (an expiry batch of 1,000 orders, a checkout group of 256) writes a row
/// per 32 of them, so a claim of `OUTBOX_BATCH_SIZE` rows reads at most 32
/// times as many events.
pub const EVENTS_PER_ROW: usize = events_per_row!();

/// The outbox rows of one statement's events, a fragment of the write
/// path's statement (the event store's append): `appended` returns each
/// event's position and `xmin`; a row per [`EVENTS_PER_ROW`] of them, in
/// position order, each keyed by its first. See the
/// `outbox_row_per_statement` migration.
pub const QUEUE_SQL: &str = concat!(
    "INSERT INTO outbox (position, positions, tx) \
     SELECT min(position), array_agg(position ORDER BY position), min(tx) \
     FROM (SELECT position, xmin::text::bigint AS tx, (row_number() OVER (ORDER BY position) - 1) / ",
    events_per_row!(),
    " AS part FROM appended) a \
     GROUP BY part RETURNING 1"
);

/// Whether the event `e` (of `events`) waits in the outbox, as a condition
/// on it: one probe of `outbox_tx` by the event's `xmin`, and its position
/// looked for among the positions of the rows found.
const EVENT_WAITS: &str =
    "EXISTS (SELECT 1 FROM outbox o WHERE o.tx = e.xmin::text::bigint AND e.position = ANY(o.positions))";

/// How many events the outbox rows hold, as an aggregate over `outbox`.
pub const EVENTS_WAITING: &str = "coalesce(sum(cardinality(positions)), 0)::bigint";

/// The rows one claim locked, as their events.
#[derive(Debug, Clone, Default)]
pub struct Claimed {
    /// Every event of the rows claimed, in position order.
    pub rows: Vec<OutboxRow>,
    /// The keys of the outbox rows that hold them, in order.
    pub keys: Vec<i64>,
    /// Whether the server had synchronous standbys named when it claimed:
    /// then the relay must pass [`await_replication`] before it publishes.
    /// When none are named, no commit the claim saw waited for one, so the
    /// barrier would be a round trip that waits for nothing.
    pub needs_replication: bool,
}

#[derive(sqlx::FromRow)]
struct ClaimedRow {
    #[sqlx(flatten)]
    event: StoredEvent,
    outbox_row: i64,
    created_at: DateTime<Utc>,
    standbys: bool,
}

/// Locks up to `limit` publishable rows for this transaction and returns
/// their events, each with its message; rows other relays hold are skipped,
/// and the rows keyed in `held` (what this relay's other lanes hold) are not
/// looked at. Run it on
/// a connection opened with [`CLAIM_SETTINGS`].
pub async fn claim(
    conn: &mut PgConnection,
    limit: i64,
    held: &[i64],
) -> Result<Claimed, StoreError> {
    let rows: Vec<ClaimedRow> = sqlx::query_as(CLAIM_SQL)
        .bind(limit)
        .bind(held)
        .fetch_all(conn)
        .await?;
    let needs_replication = rows.iter().any(|r| r.standbys);
    let mut rows: Vec<OutboxRow> = rows
        .into_iter()
        .map(OutboxRow::of)
        .collect::<Result<_, _>>()?;
    rows.sort_unstable_by_key(|r| r.message.position);
    let mut keys: Vec<i64> = rows.iter().map(|r| r.row).collect();
    keys.sort_unstable();
    keys.dedup();
    Ok(Claimed {
        needs_replication,
        keys,
        rows,
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
    /// Whether a row written after the batch's last one (a key past
    /// `after`) is there now: most likely new work, committed while the
    /// batch was out on the bus.
    pub newer: bool,
}

/// The relay's delete, for [`delete`] and for checking its plan: `$1` the
/// rows' keys, `$2` the batch's last key, `$3` the positions of events of
/// those rows not settled, each written back as a row of its own.
pub const DELETE_SQL: &str = "WITH d AS (DELETE FROM outbox WHERE position = ANY($1) RETURNING positions, tx, created_at), \
          kept AS (INSERT INTO outbox (position, positions, tx, created_at) \
                   SELECT p.position, ARRAY[p.position], d.tx, d.created_at FROM d, unnest(d.positions) AS p(position) \
                   WHERE p.position = ANY($3) RETURNING 1) \
     SELECT (SELECT count(*) FROM d), \
            EXISTS (SELECT 1 FROM outbox WHERE position > $2), \
            set_config('synchronous_commit', 'off', true) IS NOT NULL";

/// Deletes settled rows by key, the outbox's primary key (`= ANY`, one
/// probe each), and makes the caller's transaction commit without waiting
/// for its WAL flush (`synchronous_commit = off`, for that transaction
/// only). A row is settled when each of its events was published or parked;
/// a row some of whose events were not (their acks failed, or the batch
/// stopped at a connection's failure) goes too, and each event of it in
/// `left` is written back as a row of its own, with the old row's
/// transaction and time, so it is claimed again first and still holds back
/// the later events of its order. Nothing is lost by the commit not
/// waiting: a delete that a crash takes back only leaves published rows in
/// the outbox, and their republish carries the same `Nats-Msg-Id` (dropped
/// inside the stream's duplicate window; consumers dedupe by event id
/// beyond it) — the same as a relay killed between publish and delete.
/// The relay commits one such transaction per batch, about a quarter of
/// all commits under load, and the flushes it no longer waits for are
/// flushes every writer shares. The replication barrier
/// ([`await_replication`]) is its own statement and keeps the session's
/// setting.
///
/// In the same statement it looks for a row past key `after` (the
/// batch's last), so that the relay claims again at once only when there
/// is likely something to claim: a claim that finds nothing costs a
/// transaction (`BEGIN`, the claim, `ROLLBACK`).
pub async fn delete(
    conn: &mut PgConnection,
    rows: &[i64],
    after: i64,
    left: &[i64],
) -> Result<Deleted, sqlx::Error> {
    let (deleted, newer): (i64, bool) = sqlx::query_as(DELETE_SQL)
        .bind(rows)
        .bind(after)
        .bind(left)
        .fetch_one(conn)
        .await?;
    Ok(Deleted {
        rows: u64::try_from(deleted).unwrap_or(0),
        newer,
    })
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

/// The relay's look before a claim, for [`look`] and for checking its
/// plan: one walk of `outbox_position` that stops at the first row not in
/// `$1`, and whether the connection's server is a standby.
pub const LOOK_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox WHERE position <> ALL($1::bigint[])), pg_is_in_recovery()";

/// What a [`look`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Whether any outbox row but those in `held` is there.
    pub waiting: bool,
    /// Whether the connection's server is a standby (an old primary after a
    /// failover): then what it sees says nothing of the primary's outbox.
    pub standby: bool,
}

/// Whether any outbox row but those at the positions in `held` (what the
/// relay's other lanes hold) is there: what a claim could take, and more
/// (rows another relay holds, rows waiting behind an older row of their
/// order). So when it says none on a primary, a claim now would find
/// nothing, and the relay looks with this single statement, on a
/// connection it keeps, instead of a claim's transaction (`BEGIN`, the
/// claim, `ROLLBACK`, and the pool's checks of the connection it takes and
/// gives back), when it has no sign of new rows: the looks of a lane that
/// holds the wake-up ([`hold_wake`]), and the polls.
pub async fn look<'c>(conn: impl sqlx::PgExecutor<'c>, held: &[i64]) -> Result<Look, sqlx::Error> {
    let (waiting, standby) = sqlx::query_as(LOOK_SQL).bind(held).fetch_one(conn).await?;
    Ok(Look { waiting, standby })
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

/// How many events wait, and how old the oldest is in seconds.
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {EVENTS_WAITING}, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox"
    ))
    .fetch_one(pool)
    .await
}

/// Positions of the events from `from` on that left the outbox (neither
/// waiting in `outbox` nor parked in `outbox_parked`): the ones the stream
/// must hold. At most `limit`, in position order, after `after`; page on
/// with the last position returned.
pub async fn published_page(
    pool: &PgPool,
    from: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<i64>, StoreError> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT e.position FROM events e \
             WHERE e.position >= $1 AND e.position > $2 \
               AND NOT {} \
               AND NOT EXISTS (SELECT 1 FROM outbox_parked p WHERE p.id = e.event_id) \
             ORDER BY e.position LIMIT $3",
        EVENT_WAITS
    ))
    .bind(from)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
