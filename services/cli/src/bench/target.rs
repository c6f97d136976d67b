//! What a strategy is driven through: a pool running one of the plain SQL
//! writes, or soldonce's checkout binary started beside this one and reached over HTTP
//! with keep-alive, as a real client would. soldonce's products, stock and
//! account are made through `store`, never by SQL of the bench's own.

use super::sql::{SqlBuyer, Write};
use super::{FlashSaleArgs, Strategy};
use crate::CliError;
use anyhow::Context;
use domain::Sku;
use futures::{StreamExt, TryStreamExt};
use sqlx::PgPool;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Units given to a SKU that must not sell out during a throughput case.
const PLENTY: i64 = 1_000_000_000;

/// What a buyer's request came to.
#[derive(Debug)]
pub enum Outcome {
    Accepted,
    SoldOut,
    Failed(String),
}

/// Units sold of one SKU, as the database has them.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    /// Orders' units (plain strategies) or reserved plus sold (soldonce).
    pub units: i64,
    /// What the stock row says is still available.
    pub available_after: i64,
}

/// What every strategy shares: the bench database, soldonce's buyer account
/// and the names of the many-SKU case.
pub struct Fixtures {
    url: String,
    pool: PgPool,
    token: String,
    many_skus: Vec<String>,
    soldonce_many_stocked: bool,
}

impl Fixtures {
    /// Connects to the bench database and creates soldonce's buyer account.
    pub async fn prepare(url: &str, skus: u32) -> Result<Fixtures, CliError> {
        let pool = store::connect(url, 8)
            .await
            .context("connecting to the bench database")?;
        let account = store::accounts::create(&pool, "bench buyer")
            .await
            .context("creating the bench's buyer account")?;
        Ok(Fixtures {
            url: url.to_owned(),
            pool,
            token: account.token,
            many_skus: (0..skus).map(|i| format!("SKU-{i:07}")).collect(),
            soldonce_many_stocked: false,
        })
    }

    /// Closes the pool.
    pub async fn close(self) {
        self.pool.close().await;
    }
}

/// A buyer of any strategy; cheap to clone into each buyer's task.
#[derive(Clone)]
pub enum Buyer {
    Sql(SqlBuyer),
    Http(HttpBuyer),
}

impl Buyer {
    /// One order of one unit of `sku`.
    pub async fn buy(&self, sku: &str) -> Outcome {
        match self {
            Buyer::Sql(b) => match b.buy(sku, 1).await {
                Ok(true) => Outcome::Accepted,
                Ok(false) => Outcome::SoldOut,
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Buyer::Http(b) => b.buy(sku).await,
        }
    }
}

/// A strategy ready to be driven.
pub struct Target {
    strategy: Strategy,
    buyer: Buyer,
    checkout: Option<RunningCheckout>,
}

impl Target {
    /// Opens the strategy's pool, or starts checkout.
    pub async fn start(
        strategy: Strategy,
        fixtures: &Fixtures,
        args: &FlashSaleArgs,
    ) -> Result<Target, CliError> {
        let write = match strategy {
            Strategy::Naive => Some(Write::Naive),
            Strategy::ForUpdate => Some(Write::ForUpdate),
            Strategy::Conditional => Some(Write::Conditional),
            Strategy::Checkout | Strategy::Coalesced => None,
        };
        if let Some(write) = write {
            let buyer = SqlBuyer::open(&fixtures.url, args.pool, write).await?;
            return Ok(Target {
                strategy,
                buyer: Buyer::Sql(buyer),
                checkout: None,
            });
        }
        let coalesce = strategy == Strategy::Coalesced;
        let (running, addr) =
            RunningCheckout::start(&fixtures.url, args.checkout_pool, coalesce).await?;
        // Idle connections are dropped before checkout's HTTP_IDLE_TIMEOUT (5 s by default).
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(args.connections.max(args.buyers))
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(Target {
            strategy,
            buyer: Buyer::Http(HttpBuyer {
                client,
                orders_url: format!("http://{addr}/v1/orders").into(),
                token: fixtures.token.as_str().into(),
            }),
            checkout: Some(running),
        })
    }

    /// A buyer to move into a task.
    pub fn buyer(&self) -> Buyer {
        self.buyer.clone()
    }

    /// A fresh SKU (or a reset one) with exactly one unit available.
    pub async fn stock_one_unit(&self, fixtures: &Fixtures, run: u32) -> Result<String, CliError> {
        let sku = format!("SELLOUT-{}-{run}", self.strategy.name());
        match &self.buyer {
            Buyer::Sql(b) => b.restock(std::slice::from_ref(&sku), 1).await?,
            Buyer::Http(_) => add_product(&fixtures.pool, &sku, 1).await?,
        }
        Ok(sku)
    }

    /// Units of `sku` sold, counted in the database.
    pub async fn count_sold(&self, fixtures: &Fixtures, sku: &str) -> Result<Counted, CliError> {
        match &self.buyer {
            Buyer::Sql(b) => {
                let (units, available_after) = b.count_sold(sku).await?;
                Ok(Counted {
                    units,
                    available_after,
                })
            }
            Buyer::Http(_) => {
                let sku = parse_sku(sku)?;
                let rows = store::catalog::show(&fixtures.pool, Some(&sku))
                    .await
                    .context("reading the sellout SKU's stock")?;
                let row = rows.first().context("the sellout SKU has no stock row")?;
                Ok(Counted {
                    units: row.reserved + row.sold,
                    available_after: row.available,
                })
            }
        }
    }

    /// The hot SKU of the throughput case, stocked so it cannot sell out.
    pub async fn stock_hot_sku(&self, fixtures: &Fixtures) -> Result<String, CliError> {
        let sku = format!("HOT-{}", self.strategy.name());
        match &self.buyer {
            Buyer::Sql(b) => b.restock(std::slice::from_ref(&sku), PLENTY).await?,
            Buyer::Http(_) => add_product(&fixtures.pool, &sku, PLENTY).await?,
        }
        Ok(sku)
    }

    /// The many SKUs of the throughput case, stocked so none sells out.
    /// soldonce's are made once and shared by its two strategies.
    pub async fn stock_many_skus(&self, fixtures: &mut Fixtures) -> Result<Vec<String>, CliError> {
        match &self.buyer {
            Buyer::Sql(b) => b.restock(&fixtures.many_skus, PLENTY).await?,
            Buyer::Http(_) if !fixtures.soldonce_many_stocked => {
                futures::stream::iter(fixtures.many_skus.iter())
                    .map(|sku| add_product(&fixtures.pool, sku, PLENTY))
                    .buffer_unordered(8)
                    .try_collect::<()>()
                    .await?;
                fixtures.soldonce_many_stocked = true;
            }
            Buyer::Http(_) => {}
        }
        Ok(fixtures.many_skus.clone())
    }

    /// Closes the pool or stops checkout.
    pub async fn stop(self) {
        match self.buyer {
            Buyer::Sql(b) => b.close().await,
            Buyer::Http(b) => drop(b),
        }
        if let Some(running) = self.checkout {
            running.stop().await;
        }
    }
}

fn parse_sku(sku: &str) -> Result<Sku, CliError> {
    Ok(Sku::parse(sku).with_context(|| format!("SKU {sku:?}"))?)
}

/// A product in soldonce's catalogue with `units` received.
async fn add_product(pool: &PgPool, sku: &str, units: i64) -> Result<(), CliError> {
    let sku = parse_sku(sku)?;
    let currency = "BRL".parse().context("currency")?;
    store::catalog::add_product(pool, &sku, "bench product", 4990, currency)
        .await
        .with_context(|| format!("adding product {sku}"))?;
    store::catalog::receive(pool, &sku, units)
        .await
        .with_context(|| format!("receiving stock of {sku}"))?;
    Ok(())
}

/// A client of the checkout the bench started.
#[derive(Clone)]
pub struct HttpBuyer {
    client: reqwest::Client,
    orders_url: Arc<str>,
    token: Arc<str>,
}

impl HttpBuyer {
    /// `POST /v1/orders` for one unit with a key of its own; a 503 is sent
    /// again with the same key, as the API asks of clients, for up to a minute.
    async fn buy(&self, sku: &str) -> Outcome {
        let key = Uuid::new_v4().to_string();
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": 1 }] });
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            let sent = self
                .client
                .post(&*self.orders_url)
                .bearer_auth(&self.token)
                .header("idempotency-key", &key)
                .json(&body)
                .send()
                .await;
            let status = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    status
                }
                Err(e) => return Outcome::Failed(format!("request: {e}")),
            };
            match status {
                202 => return Outcome::Accepted,
                409 => return Outcome::SoldOut,
                503 if Instant::now() < give_up => {
                    // A client's back-off before asking again, not a wait for a condition.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return Outcome::Failed(format!("HTTP {other}")),
            }
        }
    }
}

/// The checkout binary, started beside this one for the run: the program
/// operators deploy, measured as they run it.
struct RunningCheckout {
    child: tokio::process::Child,
}

impl RunningCheckout {
    async fn start(
        url: &str,
        pool_size: u32,
        coalesce: bool,
    ) -> Result<(RunningCheckout, SocketAddr), CliError> {
        let port = localservers::free_port().context("finding a port for checkout")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let env = [
            ("CHECKOUT_ADDR", addr.to_string()),
            ("DATABASE_URL", url.to_owned()),
            ("DATABASE_POOL_SIZE", pool_size.to_string()),
            (
                "CHECKOUT_COALESCE",
                if coalesce { "on" } else { "off" }.to_owned(),
            ),
            // One account drives the whole run: no rate limit, and no
            // database lookups capped (every token is issued in the run).
            ("ACCOUNT_RATE_LIMIT", "0".to_owned()),
            ("TOKEN_LOOKUP_RATE", "0".to_owned()),
            ("ACCOUNT_MAX_RESERVED_UNITS", "0".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ];
        let child = crate::children::spawn_service("checkout", &env)?;
        let running = RunningCheckout { child };
        if let Err(e) = crate::children::wait_ready(&format!("http://{addr}/readyz")).await {
            running.stop().await;
            return Err(e);
        }
        Ok((running, addr))
    }

    /// SIGTERM, so checkout drains; killed if it lingers.
    async fn stop(self) {
        crate::children::stop(vec![self.child]).await;
    }
}
