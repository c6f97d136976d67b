//! `TestApp`: a fresh database, the real checkout on port 0, and typed helpers.

use crate::servers;
use serde_json::Value;
use sqlx::PgPool;
use std::net::SocketAddr;
use std::time::Duration;
use uuid::Uuid;

/// The webhook secret tests sign with.
pub const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The operators' admin token the test checkout runs with.
pub const ADMIN_TOKEN: &str = "admin-token-for-tests-0123456789";

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts an RFC 9457 body with this status.
    pub fn assert_problem(&self, status: u16) {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        assert_eq!(self.body["status"], status, "{}", self.body);
        assert!(
            self.body["type"].is_string() && self.body["title"].is_string(),
            "{}",
            self.body
        );
    }
}

/// The three buckets of one SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// A running checkout over its own database.
pub struct TestApp {
    pub addr: SocketAddr,
    pub pool: PgPool,
    pub database_url: String,
    pub client: reqwest::Client,
    pub account_id: Uuid,
    pub token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestApp {
    /// A checkout with the default reservation TTL.
    pub async fn spawn() -> TestApp {
        TestApp::spawn_with_ttl(Duration::from_secs(15 * 60)).await
    }

    /// A checkout whose reservations last `ttl`.
    pub async fn spawn_with_ttl(ttl: Duration) -> TestApp {
        TestApp::spawn_on(servers::fresh_database().await, ttl).await
    }

    /// A checkout over an existing migrated database.
    pub async fn spawn_on(database_url: String, ttl: Duration) -> TestApp {
        TestApp::spawn_configured(database_url, ttl, |_| {}).await
    }

    /// A checkout with these abuse limits, over a fresh database.
    pub async fn spawn_with_limits(limits: checkout::Limits) -> TestApp {
        TestApp::spawn_configured(
            servers::fresh_database().await,
            Duration::from_secs(900),
            |s| s.limits = limits,
        )
        .await
    }

    /// A checkout whose settings `configure` adjusts before it starts.
    pub async fn spawn_configured(
        database_url: String,
        ttl: Duration,
        configure: impl FnOnce(&mut checkout::Settings),
    ) -> TestApp {
        let mut settings = checkout::Settings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: database_url.clone(),
            reservation_ttl: ttl,
            pool_size: 32,
            webhook_secrets: Some(checkout::Secrets::parse(WEBHOOK_SECRET).expect("test secret")),
            ops_addr: None,
            limits: checkout::Limits::unlimited(),
            coalesce: checkout::Coalesce::default(),
            http: checkout::HttpLimits::default(),
            admin_token: Some(ADMIN_TOKEN.to_owned()),
            action_extension: Duration::from_secs(600),
        };
        configure(&mut settings);
        let app = checkout::Application::build(settings)
            .await
            .expect("build checkout");
        let addr = app.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        // Through the store, so a test on a primary and its standby follows
        // the failover as the services do.
        let pool = store::connect(&database_url, 10)
            .await
            .expect("connect test database");
        let account = store::accounts::create(&pool, "test buyer")
            .await
            .expect("create account");
        // Idle connections are dropped before checkout's HTTP_IDLE_TIMEOUT (5 s)
        // closes them: reusing one the server is closing fails the request.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1000)
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        TestApp {
            addr,
            pool,
            database_url,
            client,
            account_id: account.account_id,
            token: account.token,
            stop: Some(stop),
        }
    }

    /// The base URL of checkout.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Checkout's `/metrics` text (the registry is this test process's).
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Adds a product priced in BRL with `stock` units received.
    pub async fn add_product(&self, sku: &str, price_minor: i64, stock: i64) {
        let sku = domain::Sku::parse(sku).expect("sku");
        store::catalog::add_product(
            &self.pool,
            &sku,
            "test product",
            price_minor,
            "BRL".parse().expect("currency"),
        )
        .await
        .expect("add product");
        if stock > 0 {
            store::catalog::receive(&self.pool, &sku, stock)
                .await
                .expect("receive stock");
        }
    }

    /// A second account and its token.
    pub async fn new_account(&self, name: &str) -> (Uuid, String) {
        let a = store::accounts::create(&self.pool, name)
            .await
            .expect("create account");
        (a.account_id, a.token)
    }

    /// `POST /v1/orders` with a JSON body.
    pub async fn place(&self, token: &str, key: &str, body: &Value) -> Reply {
        self.send(self.place_request(token, key, body)).await
    }

    /// `POST /v1/orders` with a JSON body: its status and its body as the
    /// bytes sent, for comparing answers byte for byte.
    pub async fn place_text(&self, token: &str, key: &str, body: &Value) -> (u16, String) {
        let reply = self
            .place_request(token, key, body)
            .send()
            .await
            .expect("POST /v1/orders");
        let status = reply.status().as_u16();
        (status, reply.text().await.expect("body"))
    }

    fn place_request(&self, token: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client
            .post(self.url("/v1/orders"))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_string())
    }

    /// `POST /v1/orders` for one line, with a fresh key, as the default account.
    pub async fn buy(&self, sku: &str, quantity: i64) -> Reply {
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": quantity }] });
        self.place(&self.token, &Uuid::new_v4().to_string(), &body)
            .await
    }

    /// `POST /v1/orders` for one line as the default account, the way a
    /// client should: a 503 is retried with the same key (see
    /// [`TestApp::place_retrying`]).
    pub async fn buy_retrying(&self, sku: &str, quantity: i64) -> Reply {
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": quantity }] });
        self.place_retrying(&self.token, &Uuid::new_v4().to_string(), &body)
            .await
    }

    /// `POST /v1/orders` the way the contract asks of a client: a 503 (the
    /// database busy: on a shared test machine the pool can time out under
    /// a flash sale) is retried with the same key until checkout answers
    /// something else, which is the answer counted.
    pub async fn place_retrying(&self, token: &str, key: &str, body: &Value) -> Reply {
        crate::eventually(
            "checkout to answer without 503 or key-in-flight",
            std::time::Duration::from_secs(120),
            || async {
                let r = self.place(token, key, body).await;
                // A 503 may come while the first attempt is still being
                // placed: the retry is then told the key is in flight, and
                // retries later too, as the contract asks.
                let in_flight = r.status == 409
                    && r.body["type"] == "urn:soldonce:problem:idempotency-key-in-flight";
                (r.status != 503 && !in_flight).then_some(r)
            },
        )
        .await
    }

    /// `GET` a path as `token`.
    pub async fn get(&self, token: &str, path: &str) -> Reply {
        self.send(self.client.get(self.url(path)).bearer_auth(token))
            .await
    }

    /// `POST` a path with no body as `token`.
    pub async fn post_empty(&self, token: &str, path: &str) -> Reply {
        self.send(self.client.post(self.url(path)).bearer_auth(token))
            .await
    }

    /// Sends a request and reads the whole reply.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("request reaches checkout");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("read body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    /// The buckets of `sku`, from the `stock` table.
    pub async fn buckets(&self, sku: &str) -> Buckets {
        let (available, reserved, sold): (i64, i64, i64) =
            sqlx::query_as("SELECT available, reserved, sold FROM stock_buckets WHERE sku = $1")
                .bind(sku)
                .fetch_one(&self.pool)
                .await
                .expect("stock row");
        Buckets {
            available,
            reserved,
            sold,
        }
    }

    /// The buckets of `sku` as the ledger sums them.
    pub async fn ledger(&self, sku: &str) -> Buckets {
        let (available, reserved, sold): (i64, i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(d_available), 0)::bigint, coalesce(sum(d_reserved), 0)::bigint, coalesce(sum(d_sold), 0)::bigint \
             FROM stock_ledger WHERE sku = $1",
        )
        .bind(sku)
        .fetch_one(&self.pool)
        .await
        .expect("ledger sums");
        Buckets {
            available,
            reserved,
            sold,
        }
    }

    /// A single count from SQL.
    pub async fn count(&self, sql: &str) -> i64 {
        let (n,): (i64,) = sqlx::query_as(sql)
            .fetch_one(&self.pool)
            .await
            .expect("count query");
        n
    }

    /// Polls until the count from `sql` is `expected` (within 30 s).
    pub async fn wait_count(&self, what: &str, sql: &str, expected: i64) {
        crate::eventually(what, Duration::from_secs(30), || async {
            (self.count(sql).await == expected).then_some(())
        })
        .await;
    }

    /// Locks `sku`'s stock row in a transaction of its own, as another
    /// writer would: the transaction, and its backend's pid for
    /// [`TestApp::wait_blocked_by`].
    pub async fn hold_stock_row(
        &self,
        sku: &str,
    ) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
        let mut tx = self.pool.begin().await.expect("begin");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .expect("pid");
        sqlx::query("SELECT * FROM stock WHERE sku = $1 FOR UPDATE")
            .bind(sku)
            .execute(&mut *tx)
            .await
            .expect("lock the stock row");
        (tx, pid)
    }

    /// Waits until one statement waits on a lock the backend `pid` holds
    /// (found by its blocker, not by its text: `pg_stat_activity` keeps only
    /// the first KiB of a query).
    pub async fn wait_blocked_by(&self, pid: i32, what: &str) {
        crate::eventually(what, Duration::from_secs(10), || async {
            let waiting = self
                .count(&format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND {pid} = ANY(pg_blocking_pids(pid))"
                ))
                .await;
            (waiting == 1).then_some(())
        })
        .await;
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
