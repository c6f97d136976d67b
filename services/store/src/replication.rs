//! Positive confirmation that a commit reached the synchronous standbys.
//!
//! With `synchronous_standby_names` set, a commit waits until the standbys
//! have its WAL. But if that wait is cancelled (`pg_cancel_backend`, a
//! pooler's or a client's timeout) or its session terminated, PostgreSQL
//! keeps the commit locally, shows it to everyone, and reports success: a
//! failover then takes it back. So whoever is about to tell the world that
//! something is durable — checkout's `202` (or the replay of one), a
//! consumer's ack, the relay's publish — first checks that every required
//! standby has flushed (or written, or applied: as `synchronous_commit`
//! says) WAL up to this server's flush position, read right after the
//! commit: that position is past the commit record, which is flushed
//! locally before the wait begins, and past every commit this session saw.
//!
//! Cheap when no synchronous standby is named: one trivial statement that
//! reads two settings. The
//! role needs `pg_read_all_stats` (or superuser) to see the standbys'
//! positions in `pg_stat_replication`; without it nothing can be confirmed
//! and the error says so.

use crate::StoreError;
use sqlx::PgConnection;
use std::time::{Duration, Instant};

/// How long a confirmation polls before giving up.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(2);

/// How often it polls meanwhile.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// Whether commits on this server wait for synchronous standbys, as an
/// SQL expression: a column a transaction's own statement reads (put
/// together with `concat!`), so that [`confirm_if`] after its commit needs
/// no statement of its own when none is named. Read before the commit
/// rather than after it: a setting changed in between (an operator naming
/// or dropping a standby and reloading) is missed either way, for that one
/// commit.
macro_rules! waits {
    () => {
        "(current_setting('synchronous_standby_names') <> '' \
          AND current_setting('synchronous_commit') NOT IN ('off', 'local'))"
    };
}
pub(crate) use waits;

/// Whether commits on this server wait for synchronous standbys.
const WAITS_SQL: &str = concat!("SELECT ", waits!());

/// Whether the required synchronous standbys hold WAL up to `$1` (or, when
/// `$1` is null, up to this server's flush position, which it returns).
/// The number required is `synchronous_standby_names`' `FIRST n` / `ANY n`
/// (1 for the plain forms): with `FIRST n` at most n standbys are `sync`,
/// with `ANY n` every listed one is `quorum` and n must have it.
const CONFIRM_SQL: &str = "\
WITH s AS (SELECT current_setting('synchronous_standby_names') AS names, \
                  current_setting('synchronous_commit') AS mode, \
                  pg_current_wal_flush_lsn() AS here) \
SELECT coalesce($1::pg_lsn, s.here)::text, \
       s.names = '' OR s.mode IN ('off', 'local') OR \
       (SELECT count(*) FROM pg_stat_replication r \
         WHERE r.sync_state IN ('sync', 'quorum') \
           AND CASE s.mode WHEN 'remote_apply' THEN r.replay_lsn \
                           WHEN 'remote_write' THEN r.write_lsn \
                           ELSE r.flush_lsn END >= coalesce($1::pg_lsn, s.here)) \
       >= coalesce((regexp_match(s.names, '^\\s*(?:(?:first|any)\\s+)?(\\d+)\\s*\\(', 'i'))[1]::int, 1), \
       EXISTS (SELECT 1 FROM pg_stat_replication r WHERE r.sync_state IS NULL) \
FROM s";

/// Returns once the required synchronous standbys hold everything this
/// server had flushed when it was called (at once when none are named),
/// or [`StoreError::NotReplicated`] after [`CONFIRM_WITHIN`]. `site` names
/// the caller in the metrics (`checkout`, `consumer`, `relay`).
pub async fn confirm(conn: &mut PgConnection, site: &'static str) -> Result<(), StoreError> {
    // Without synchronous standbys (or with commits that do not wait for
    // them) there is nothing to confirm: a trivial statement, which never
    // reads pg_stat_replication (a view over every backend's state).
    confirm_if(conn, None, site).await
}

/// [`confirm`] when the committed transaction read `waits!` as
/// `waits`: at once, without a statement, when it was false; `None` when
/// it did not read it, which is read now.
pub async fn confirm_if(
    conn: &mut PgConnection,
    waits: Option<bool>,
    site: &'static str,
) -> Result<(), StoreError> {
    let waits = match waits {
        Some(waits) => waits,
        None => sqlx::query_scalar(WAITS_SQL).fetch_one(&mut *conn).await?,
    };
    if !waits {
        return Ok(());
    }
    let started = Instant::now();
    let mut lsn: Option<String> = None;
    loop {
        let (at, confirmed, hidden): (String, bool, bool) = sqlx::query_as(CONFIRM_SQL)
            .bind(lsn.as_deref())
            .fetch_one(&mut *conn)
            .await?;
        if confirmed {
            if lsn.is_some() {
                metrics::histogram!("soldonce_replication_wait_seconds", "site" => site)
                    .record(started.elapsed().as_secs_f64());
            }
            return Ok(());
        }
        if started.elapsed() >= CONFIRM_WITHIN {
            metrics::counter!("soldonce_replication_unconfirmed_total", "site" => site)
                .increment(1);
            let why = if hidden {
                "this role cannot see the standbys' positions (grant it pg_read_all_stats)"
            } else {
                "the synchronous standbys have not confirmed it"
            };
            return Err(StoreError::NotReplicated(format!(
                "WAL up to {at} not confirmed within {} s: {why}",
                CONFIRM_WITHIN.as_secs()
            )));
        }
        lsn.get_or_insert(at);
        tokio::time::sleep(POLL_EVERY).await;
    }
}
