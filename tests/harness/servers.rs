//! The servers every test in this process shares, and a fresh database per test.

use localservers::{Nats, PgOptions, Postgres};
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::OnceLock;
use uuid::Uuid;

/// The shared servers. Tests that kill and restart a server start their own.
pub struct Shared {
    pub postgres: Postgres,
    pub nats: Nats,
}

static SHARED: OnceLock<Shared> = OnceLock::new();
static TEMPLATE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
static CREATE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared servers, started on first use. A missing binary fails the
/// test with one line saying what to install.
pub fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        init_logs();
        let postgres =
            Postgres::start_temporary(PgOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let nats = Nats::start_temporary().unwrap_or_else(|e| panic!("{e}"));
        Shared { postgres, nats }
    })
}

/// Logs print only when `TEST_LOG` is set.
pub fn init_logs() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info,sqlx=warn")
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Creates a migrated database named `template_soldonce` on `pg`, once.
async fn template(pg: &Postgres) {
    TEMPLATE
        .get_or_init(|| async {
            let mut admin = PgConnection::connect(&pg.url("postgres"))
                .await
                .expect("connect to test postgres");
            sqlx::query("CREATE DATABASE template_soldonce")
                .execute(&mut admin)
                .await
                .expect("create template");
            let pool = PgPool::connect(&pg.url("template_soldonce"))
                .await
                .expect("connect to template");
            store::migrate(&pool).await.expect("migrate template");
            pool.close().await;
        })
        .await;
}

/// A fresh migrated database on the shared server; returns its URL.
pub async fn fresh_database() -> String {
    fresh_database_on(&shared().postgres).await
}

/// An empty database on the shared server, no migration applied (to
/// migrate it step by step, as an upgrade does); returns its URL.
pub async fn empty_database() -> String {
    let pg = &shared().postgres;
    let name = format!("t_{}", Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&pg.url("postgres"))
        .await
        .expect("connect to test postgres");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("create an empty database");
    pg.url(&name)
}

/// A fresh migrated database on `pg` (which must be the shared server or
/// one with its own template created by [`migrated_database_on`]).
pub async fn fresh_database_on(pg: &Postgres) -> String {
    template(pg).await;
    let name = format!("t_{}", Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&pg.url("postgres"))
        .await
        .expect("connect to test postgres");
    let sql = format!("CREATE DATABASE {name} TEMPLATE template_soldonce");
    // Copies of one template must not run concurrently.
    let guard = CREATE_LOCK.lock().await;
    let created = sqlx::query(&sql).execute(&mut admin).await;
    drop(guard);
    created.expect("create test database");
    pg.url(&name)
}

/// A migrated database on a private server of a test's own.
pub async fn migrated_database_on(pg: &Postgres) -> String {
    let url = pg.url("postgres");
    let pool = PgPool::connect(&url)
        .await
        .expect("connect to private postgres");
    store::migrate(&pool).await.expect("migrate");
    pool.close().await;
    url
}

/// A durable primary whose commits wait for one synchronous standby
/// (`synchronous_standby_names=standby`), and that standby, under `dir`.
pub fn primary_with_standby(dir: &std::path::Path) -> (Postgres, Postgres) {
    let primary = Postgres::start_in(
        &dir.join("primary"),
        PgOptions {
            durable: true,
            settings: vec!["synchronous_standby_names=standby".into()],
            ..PgOptions::default()
        },
    )
    .expect("primary");
    let standby = Postgres::start_standby_in(
        &dir.join("standby"),
        &primary,
        "standby",
        PgOptions {
            durable: true,
            ..PgOptions::default()
        },
    )
    .expect("standby");
    (primary, standby)
}

/// Waits for a client's `COMMIT` waiting for the synchronous standby on
/// the server behind `pool` (`what` names it), and returns its backend's pid.
pub async fn commit_waiting_for_standby(pool: &PgPool, what: &str) -> i32 {
    let waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
                   AND backend_type = 'client backend' AND query = 'COMMIT'";
    let (pid,): (i32,) = crate::eventually(what, std::time::Duration::from_secs(30), || async {
        sqlx::query_as(waiting).fetch_optional(pool).await.ok()?
    })
    .await;
    pid
}
