//! checkout: soldonce's HTTP API. It places orders (idempotency claim,
//! events, outbox rows and the stock reservation in one transaction), reads
//! them and cancels them. It must never trust a client's price, never
//! read-then-write stock, and never answer with a stack trace.

mod auth;
mod error;
mod orders;
mod place;
mod request;
mod view;
mod webhooks;

pub use webhooks::Secrets;

pub use view::OrderView;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use platform::config::{self, ConfigError};
use sqlx::PgPool;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// checkout's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `CHECKOUT_ADDR`, default `127.0.0.1:8080`; port 0 picks a free port.
    pub addr: SocketAddr,
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `RESERVATION_TTL`, default 15 minutes: how long a reservation waits for payment.
    pub reservation_ttl: Duration,
    /// `DATABASE_POOL_SIZE`, default 32: the bound on concurrent transactions.
    pub pool_size: u32,
    /// `WEBHOOK_SECRET`: the PSP's signing secrets (`whsec_…`, space-separated
    /// during a rotation); without it `/v1/psp/webhooks` is not served.
    pub webhook_secrets: Option<Secrets>,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let pool_size = config::parsed("DATABASE_POOL_SIZE", 32u32)?;
        if pool_size == 0 {
            return Err(ConfigError::new("DATABASE_POOL_SIZE", "must be at least 1"));
        }
        let reservation_ttl = config::duration("RESERVATION_TTL", Duration::from_secs(15 * 60))?;
        if reservation_ttl.is_zero() {
            return Err(ConfigError::new("RESERVATION_TTL", "must be longer than zero"));
        }
        Ok(Settings {
            addr: config::parsed("CHECKOUT_ADDR", SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            database_url: config::database_url()?,
            reservation_ttl,
            pool_size,
            webhook_secrets: config::optional("WEBHOOK_SECRET")?
                .map(|s| Secrets::parse(&s).map_err(|e| ConfigError::new("WEBHOOK_SECRET", e)))
                .transpose()?,
        })
    }
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub pool: PgPool,
    pub ttl: chrono::Duration,
    pub tokens: Arc<auth::TokenCache>,
    pub webhook_secrets: Option<Arc<Secrets>>,
}

/// A bound, ready-to-run checkout.
pub struct Application {
    listener: TcpListener,
    router: Router,
}

impl Application {
    /// Connects to the database and binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = store::connect(&settings.database_url, settings.pool_size)
            .await
            .context("connecting to DATABASE_URL")?;
        let listener = TcpListener::bind(settings.addr).await.with_context(|| format!("binding {}", settings.addr))?;
        let ttl = chrono::Duration::from_std(settings.reservation_ttl).context("RESERVATION_TTL is too long")?;
        Ok(Application { listener, router: router(AppState { pool, ttl, tokens: Arc::default(), webhook_secrets: settings.webhook_secrets.map(Arc::new) }) })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves until `shutdown` resolves, then finishes in-flight requests.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        axum::serve(self.listener, self.router).with_graceful_shutdown(shutdown).await
    }
}

fn router(state: AppState) -> Router {
    let ready = store::readiness(state.pool.clone());
    Router::new()
        .route("/v1/orders", post(place::place_order))
        .route("/v1/orders/{id}", get(orders::get_order))
        .route("/v1/orders/{id}/events", get(orders::get_events))
        .route("/v1/orders/{id}/cancel", post(orders::cancel_order))
        .route("/v1/psp/webhooks", post(webhooks::receive))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .merge(platform::ops::router(ready))
}
