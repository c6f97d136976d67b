//! Connecting to PostgreSQL, and finding the primary again after a failover.
//!
//! `DATABASE_URL` may name several servers the way libpq does:
//! `postgres://soldonce@db1:5432,db2:5432/soldonce?target_session_attrs=read-write`.
//! The pool connects to the first server that answers and, with
//! `read-write` (or `primary`), only to one that is not in recovery: a
//! standby's connections are refused as they open. A watcher then asks the
//! pool once a second whether it still reaches a writable primary; when it
//! does not (the primary died, or was demoted), it asks each server in turn
//! and points the pool's new connections at the one that now takes writes.
//! Connections to the old primary fail their next ping and are replaced.
//!
//! soldonce never promotes a standby itself: that is the orchestrator's job
//! (pg_auto_failover, Patroni, an operator's `pg_ctl promote`), as is
//! fencing the old primary so that two servers never take writes at once.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;

/// How long a pool waits for a connection before the caller is told the
/// database is unavailable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the watcher checks that the pool still reaches the primary.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long a pool being opened waits for a server that will do.
const STARTUP_WAIT: Duration = Duration::from_secs(30);
/// How long one check, or one server's probe, may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The `sslmode`s libpq knows, as `DATABASE_URL` may give them: `disable`
/// never encrypts, `prefer` (the default) encrypts when the server offers
/// it, `require` always (trusting any certificate), `verify-ca` checks the
/// certificate against `sslrootcert` (or the platform's roots), and
/// `verify-full` also checks that it names the host.
const SSL_MODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// The servers a `DATABASE_URL` names, and which of them will do.
#[derive(Debug, Clone)]
pub struct Target {
    /// One set of options per server, in the URL's order.
    pub servers: Vec<PgConnectOptions>,
    /// Only a server that takes writes will do (`target_session_attrs` is
    /// `read-write` or `primary`).
    pub read_write: bool,
}

impl Target {
    /// Reads a `postgres://` URL naming one server or several
    /// (`host1:port1,host2:port2`), with an optional
    /// `target_session_attrs` of `any`, `read-write` or `primary`.
    pub fn parse(url: &str) -> Result<Target, sqlx::Error> {
        let bad = |why: &str| sqlx::Error::Configuration(format!("DATABASE_URL: {why}").into());
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a postgres:// URL"))?;
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(bad("not a postgres:// URL"));
        }
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (tail, None),
        };
        let mut read_write = false;
        let mut kept = vec![];
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("target_session_attrs", value)) => {
                    read_write = match value {
                        "any" => false,
                        "read-write" | "primary" => true,
                        other => {
                            return Err(bad(&format!(
                                "target_session_attrs={other} is not supported: use any, read-write or primary"
                            )))
                        }
                    }
                }
                Some(("sslmode", value)) => {
                    if !SSL_MODES.contains(&value) {
                        return Err(bad(&format!(
                            "sslmode={value} is not one of {}",
                            SSL_MODES.join(", ")
                        )));
                    }
                    kept.push(pair);
                }
                Some(("sslrootcert", path)) => {
                    if path != "system" && !std::path::Path::new(path).is_file() {
                        return Err(bad(&format!("sslrootcert={path}: no such file")));
                    }
                    kept.push(pair);
                }
                _ if !pair.is_empty() => kept.push(pair),
                _ => {}
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let mut servers = vec![];
        // An empty host list (a socket given as `?host=/run/postgresql`) is
        // one server.
        for host in hosts.split(',') {
            if host.is_empty() && hosts.contains(',') {
                return Err(bad("an empty host in the list of servers"));
            }
            let one = format!("{scheme}://{userinfo}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&one)?;
            servers.push(match options.get_application_name() {
                Some(_) => options,
                None => options.application_name(&program_name()),
            });
        }
        Ok(Target {
            servers,
            read_write,
        })
    }

    /// Whether there is anything to watch: several servers, or one that
    /// must be writable.
    fn watched(&self) -> bool {
        self.servers.len() > 1 || self.read_write
    }

    /// The first server, in the URL's order, that answers and will do.
    pub async fn find(&self) -> Option<&PgConnectOptions> {
        for server in &self.servers {
            match tokio::time::timeout(PROBE_TIMEOUT, probe(server)).await {
                Ok(Ok(in_recovery)) if !(self.read_write && in_recovery) => return Some(server),
                Ok(Ok(_)) => {
                    tracing::debug!(server = %name(server), "PostgreSQL server is a standby");
                }
                Ok(Err(e)) => {
                    tracing::debug!(server = %name(server), error = %e, "PostgreSQL server did not answer");
                }
                Err(_) => {
                    tracing::debug!(server = %name(server), "PostgreSQL server did not answer in time");
                }
            }
        }
        None
    }
}

/// `host:port` of a server, for logs.
fn name(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// Whether a server is in recovery (a standby), on a connection of its own.
async fn probe(server: &PgConnectOptions) -> Result<bool, sqlx::Error> {
    let mut conn = server.clone().disable_statement_logging().connect().await?;
    let in_recovery = in_recovery(&mut conn).await;
    let _ = conn.close().await;
    in_recovery
}

async fn in_recovery(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let (in_recovery,): (bool,) = sqlx::query_as("SELECT pg_is_in_recovery()")
        .fetch_one(conn)
        .await?;
    Ok(in_recovery)
}

/// Opens a pool of at most `max_connections` on the server `url` names (the
/// first one that will do, when it names several), watched for failover
/// when it names several or asks for `target_session_attrs=read-write`.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    connect_with_settings(url, max_connections, &[]).await
}

/// [`connect`], with server settings (`name`, `value`) every connection of
/// the pool starts with, as `PGOPTIONS='-c name=value'` would give. The
/// process's clock is set by the database's from then on
/// ([`crate::clock`]).
pub async fn connect_with_settings(
    url: &str,
    max_connections: u32,
    settings: &[(&str, &str)],
) -> Result<PgPool, sqlx::Error> {
    let pool = open(url, max_connections, settings)
        .await
        .map_err(explain)?;
    crate::clock::sync(&pool).await?;
    crate::clock::keep_synced(pool.clone());
    Ok(pool)
}

/// A failure to connect that TLS explains, said in one line naming the
/// variable to change.
fn explain(e: sqlx::Error) -> sqlx::Error {
    let said = |why: String| sqlx::Error::Configuration(format!("DATABASE_URL: {why}").into());
    match e {
        sqlx::Error::Tls(e) => said(format!(
            "the TLS connection to the database failed ({e}); check sslmode and sslrootcert"
        )),
        // rustls's verdicts on the server's certificate reach sqlx as I/O errors.
        sqlx::Error::Io(e) if e.to_string().contains("certificate") => said(format!(
            "the TLS connection to the database failed ({e}); check sslmode and sslrootcert"
        )),
        sqlx::Error::Database(d) if d.message().contains("no encryption") => said(format!(
            "the database refuses connections without TLS ({}); set sslmode=verify-full (with sslrootcert) or require",
            d.message()
        )),
        other => other,
    }
}

async fn open(
    url: &str,
    max_connections: u32,
    settings: &[(&str, &str)],
) -> Result<PgPool, sqlx::Error> {
    let mut target = Target::parse(url)?;
    if !settings.is_empty() {
        for server in &mut target.servers {
            *server = server.clone().options(settings.iter().copied());
        }
    }
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT);
    if !target.watched() {
        return pool.connect_with(target.servers[0].clone()).await;
    }
    // Started mid-failover (the primary gone, the standby not yet
    // promoted), wait for the new primary a while rather than exit.
    let deadline = tokio::time::Instant::now() + STARTUP_WAIT;
    let mut found = target.find().await.cloned();
    while found.is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(WATCH_EVERY).await;
        found = target.find().await.cloned();
    }
    let Some(first) = found else {
        return Err(sqlx::Error::Configuration(
            format!(
                "none of the PostgreSQL servers in DATABASE_URL ({}) answered{} within 30 s",
                target
                    .servers
                    .iter()
                    .map(name)
                    .collect::<Vec<_>>()
                    .join(", "),
                if target.read_write {
                    " as a writable primary"
                } else {
                    ""
                }
            )
            .into(),
        ));
    };
    let read_write = target.read_write;
    let pool = pool
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if read_write && in_recovery(conn).await? {
                    return Err(sqlx::Error::Configuration(
                        "this PostgreSQL server is a standby; waiting for the primary".into(),
                    ));
                }
                Ok(())
            })
        })
        .connect_with(first.clone())
        .await?;
    tracing::info!(server = %name(&first), servers = target.servers.len(), "connected to PostgreSQL");
    tokio::spawn(follow_primary(pool.clone(), target));
    Ok(pool)
}

/// Keeps `pool` pointed at the server that will do, until it is closed.
async fn follow_primary(pool: PgPool, target: Target) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if pool.is_closed() {
            return;
        }
        let healthy = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, async {
                let mut conn = pool.acquire().await?;
                in_recovery(&mut conn).await
            })
            .await,
            Ok(Ok(in_recovery)) if !(target.read_write && in_recovery)
        );
        if healthy {
            continue;
        }
        let current = pool.connect_options();
        match target.find().await {
            Some(found) if name(found) != name(&current) => {
                tracing::warn!(
                    from = %name(&current),
                    to = %name(found),
                    "PostgreSQL failover: new connections go to the server that now takes writes"
                );
                metrics::counter!("soldonce_postgres_failovers_total").increment(1);
                pool.set_connect_options(found.clone());
            }
            Some(_) => {}
            None => tracing::warn!(
                servers = target.servers.len(),
                "no PostgreSQL server in DATABASE_URL takes writes yet"
            ),
        }
    }
}

/// A pool like `source` (its settings, at most `max_connections`, opened
/// as needed) whose connections go wherever `source`'s go, for work on
/// another runtime than `source`'s: a connection belongs to the runtime
/// that opened it, and one whose runtime is busy answers late. A task on
/// the caller's runtime points it at `source`'s server once a second (after
/// a failover, see [`connect`]), until either pool is closed.
pub fn mirror(source: &PgPool, max_connections: u32) -> PgPool {
    let options = source.options().clone();
    let least = options.get_min_connections().min(max_connections);
    let pool = options
        .max_connections(max_connections)
        .min_connections(least)
        .connect_lazy_with((*source.connect_options()).clone());
    tokio::spawn(follow_source(source.clone(), pool.clone()));
    pool
}

/// Keeps `pool` pointed at `source`'s server.
async fn follow_source(source: PgPool, pool: PgPool) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if source.is_closed() || pool.is_closed() {
            return;
        }
        let to = source.connect_options();
        if name(&to) != name(&pool.connect_options()) {
            pool.set_connect_options((*to).clone());
        }
    }
}

/// The `application_name` a connection gives the server when
/// `DATABASE_URL` names none: `soldonce-` and the running program's name
/// (`soldonce-checkout`, `soldonce-payment-worker`), so `pg_stat_activity`,
/// the server's log (`%a` in `log_line_prefix`) and the benchmarks tell
/// which service each connection and its work belongs to.
fn program_name() -> String {
    let program = std::env::args_os()
        .next()
        .and_then(|arg| {
            std::path::Path::new(&arg)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .filter(|n| !n.is_empty());
    match program {
        Some(program) if program != "soldonce" => format!("soldonce-{program}"),
        _ => "soldonce".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_is_one_target_and_unwatched() {
        let t = Target::parse("postgres://u:p@db:5433/shop?sslmode=disable").expect("a URL");
        assert_eq!(t.servers.len(), 1);
        assert_eq!(name(&t.servers[0]), "db:5433");
        assert!(!t.read_write && !t.watched());
    }

    #[test]
    fn several_servers_keep_their_order_user_database_and_parameters() {
        let t = Target::parse(
            "postgresql://soldonce:pw@db1:5432,db2,[::1]:6000/shop?target_session_attrs=read-write&application_name=x",
        )
        .expect("a URL");
        let names: Vec<String> = t.servers.iter().map(name).collect();
        assert_eq!(names, ["db1:5432", "db2:5432", "[::1]:6000"]);
        for s in &t.servers {
            assert_eq!(s.get_username(), "soldonce");
            assert_eq!(s.get_database(), Some("shop"));
        }
        assert!(t.read_write && t.watched());
        for s in &t.servers {
            assert_eq!(
                s.get_application_name(),
                Some("x"),
                "the URL's own name is kept"
            );
        }
        let t = Target::parse("postgres://db/shop").expect("a URL");
        let named = t.servers[0].get_application_name().expect("a name");
        assert!(named.starts_with("soldonce"), "{named}");
    }

    #[test]
    fn unsupported_session_attributes_and_empty_hosts_are_refused_clearly() {
        let e = Target::parse("postgres://db1,db2/x?target_session_attrs=standby")
            .expect_err("refused");
        assert!(
            e.to_string()
                .contains("target_session_attrs=standby is not supported"),
            "{e}"
        );
        let e = Target::parse("postgres://db1,,db2/x").expect_err("refused");
        assert!(e.to_string().contains("empty host"), "{e}");
        let e = Target::parse("mysql://db/x").expect_err("refused");
        assert!(e.to_string().contains("not a postgres:// URL"), "{e}");
    }
}
