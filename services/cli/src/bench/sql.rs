//! The bench's own database, and the plain SQL strategies soldonce is
//! compared with. The only file of the CLI that runs SQL (scripts/lint.sh
//! names it as the one exception): these strategies write stock the ways
//! soldonce must not — that is what is measured — and only into tables of
//! their own (`bench_stock`, `bench_orders`) in a database the bench
//! created. soldonce's own tables are touched only through `store`.

use crate::CliError;
use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// The plain strategies' tables: stock rows and minimal orders.
const BENCH_TABLES: &str = "\
CREATE TABLE bench_stock (sku text PRIMARY KEY, available bigint NOT NULL);
CREATE TABLE bench_orders (
    id uuid PRIMARY KEY,
    sku text NOT NULL,
    quantity bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);";

/// A database the bench created on DATABASE_URL's server, migrated to
/// soldonce's schema and holding the plain strategies' tables.
pub struct BenchDatabase {
    server_url: String,
    name: String,
    url: String,
}

/// What the server says about itself, for the report's header.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    pub version: String,
    pub fsync: String,
    pub synchronous_commit: String,
    pub max_connections: u32,
}

impl BenchDatabase {
    /// Creates `soldonce_bench_<random>` beside DATABASE_URL's database,
    /// migrates it and adds the bench tables (dropping it again if that fails).
    pub async fn create(server_url: &str) -> Result<BenchDatabase, CliError> {
        let name = format!(
            "soldonce_bench_{}",
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let url = with_database(server_url, &name)?;
        let mut admin = admin_connection(server_url).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating the bench database {name}"))?;
        let _ = admin.close().await;
        let database = BenchDatabase {
            server_url: server_url.to_owned(),
            name,
            url,
        };
        if let Err(e) = database.prepare().await {
            let _ = database.drop_database().await;
            return Err(e);
        }
        Ok(database)
    }

    async fn prepare(&self) -> Result<(), CliError> {
        let pool = store::connect(&self.url, 2)
            .await
            .context("connecting to the bench database")?;
        store::migrate(&pool)
            .await
            .context("migrating the bench database")?;
        sqlx::raw_sql(BENCH_TABLES)
            .execute(&pool)
            .await
            .context("creating the bench tables")?;
        pool.close().await;
        Ok(())
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database, ending whatever sessions still use it.
    pub async fn drop_database(&self) -> Result<(), CliError> {
        let mut admin = admin_connection(&self.server_url).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await
        .with_context(|| format!("dropping the bench database {}", self.name))?;
        let _ = admin.close().await;
        Ok(())
    }

    /// The server's version and the settings that decide a commit's cost.
    pub async fn server_facts(&self) -> Result<ServerFacts, CliError> {
        let mut conn = admin_connection(&self.url).await?;
        let (version, fsync, synchronous_commit, max_connections): (
            String,
            String,
            String,
            String,
        ) = sqlx::query_as(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'), \
                        current_setting('max_connections')",
        )
        .fetch_one(&mut conn)
        .await
        .context("reading the server's version and settings")?;
        let _ = conn.close().await;
        Ok(ServerFacts {
            version,
            fsync,
            synchronous_commit,
            max_connections: max_connections.parse().unwrap_or(0),
        })
    }
}

async fn admin_connection(url: &str) -> Result<PgConnection, CliError> {
    Ok(PgConnection::connect(url)
        .await
        .context("connecting to DATABASE_URL's server")?)
}

/// `server_url` naming database `name` instead.
fn with_database(server_url: &str, name: &str) -> Result<String, CliError> {
    let mut url = reqwest::Url::parse(server_url)
        .ok()
        .filter(|u| matches!(u.scheme(), "postgres" | "postgresql"))
        .ok_or_else(|| {
            CliError::Usage(
                "DATABASE_URL: expected a postgres://user@host:port/database URL".into(),
            )
        })?;
    url.set_path(&format!("/{name}"));
    Ok(url.into())
}

/// How a plain strategy writes one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Read `available`, check it, decrement unconditionally.
    Naive,
    /// The same read with `FOR UPDATE`, so the check holds until the commit.
    ForUpdate,
    /// One `UPDATE … WHERE available >= qty`; no row updated means sold out.
    Conditional,
}

/// A buyer of one of the plain SQL strategies.
#[derive(Clone)]
pub struct SqlBuyer {
    pool: PgPool,
    write: Write,
}

impl SqlBuyer {
    /// A pool of `size` connections shared by every buyer that writes `write`'s way.
    pub async fn open(url: &str, size: u32, write: Write) -> Result<SqlBuyer, CliError> {
        let options = PgConnectOptions::from_str(url)
            .context("the bench database's URL")?
            .application_name("soldonce-bench");
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .context("connecting the SQL strategy's pool")?;
        Ok(SqlBuyer { pool, write })
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// One order of `quantity` units of `sku` in one transaction, written
    /// this buyer's way: `true` if it was taken, `false` if sold out.
    pub async fn buy(&self, sku: &str, quantity: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let taken = match self.write {
            Write::Conditional => {
                sqlx::query(
                    "UPDATE bench_stock SET available = available - $2 WHERE sku = $1 AND available >= $2",
                )
                .bind(sku)
                .bind(quantity)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
            }
            Write::ForUpdate | Write::Naive => {
                let read = if self.write == Write::ForUpdate {
                    "SELECT available FROM bench_stock WHERE sku = $1 FOR UPDATE"
                } else {
                    "SELECT available FROM bench_stock WHERE sku = $1"
                };
                let available: Option<i64> = sqlx::query_scalar(read)
                    .bind(sku)
                    .fetch_optional(&mut *tx)
                    .await?;
                let enough = available.is_some_and(|a| a >= quantity);
                if enough {
                    // Unconditional: the check above is all there is.
                    sqlx::query("UPDATE bench_stock SET available = available - $2 WHERE sku = $1")
                        .bind(sku)
                        .bind(quantity)
                        .execute(&mut *tx)
                        .await?;
                }
                enough
            }
        };
        if !taken {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("INSERT INTO bench_orders (id, sku, quantity) VALUES ($1, $2, $3)")
            .bind(Uuid::now_v7())
            .bind(sku)
            .bind(quantity)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Sets each of `skus` to `units` available and forgets their orders.
    pub async fn restock(&self, skus: &[String], units: i64) -> Result<(), CliError> {
        let mut tx = self.pool.begin().await.context("restocking")?;
        sqlx::query(
            "INSERT INTO bench_stock (sku, available) SELECT s, $2 FROM unnest($1::text[]) AS s \
             ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available",
        )
        .bind(skus)
        .bind(units)
        .execute(&mut *tx)
        .await
        .context("restocking")?;
        sqlx::query("DELETE FROM bench_orders WHERE sku = ANY($1)")
            .bind(skus)
            .execute(&mut *tx)
            .await
            .context("forgetting earlier orders")?;
        tx.commit().await.context("restocking")?;
        Ok(())
    }

    /// Units sold of `sku` as its order rows sum them, and what its stock row says is left.
    pub async fn count_sold(&self, sku: &str) -> Result<(i64, i64), CliError> {
        let counted: (i64, i64) = sqlx::query_as(
            "SELECT (SELECT coalesce(sum(quantity), 0)::bigint FROM bench_orders WHERE sku = $1), \
                    (SELECT available FROM bench_stock WHERE sku = $1)",
        )
        .bind(sku)
        .fetch_one(&self.pool)
        .await
        .context("counting units sold")?;
        Ok(counted)
    }
}
