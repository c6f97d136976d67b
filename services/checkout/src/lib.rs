//! checkout: soldonce's HTTP API. It places orders (idempotency claim,
//! events, outbox rows and the stock reservation in one transaction), reads
//! them and cancels them. It must never trust a client's price, never
//! read-then-write stock, and never answer with a stack trace.
//!
//! Layout:
//! - `lib.rs` — settings, the router, the run
//! - `place.rs` — `POST /v1/orders`: a request checked, then placed with its group
//! - `reply.rs` — a stored answer rendered as its response (placed, replayed, refused)
//! - `coalesce.rs` — gathering concurrent placements into groups (lanes)
//! - `orders.rs` — reading and cancelling an order
//! - `webhooks.rs` — the PSP's signed webhooks
//! - `webhook_payload.rs` — a webhook's body read: the payment fact or dispute it reports
//! - `disputes.rs` — `dispute.created`: recorded on the order, its shipment held, a finding opened
//! - `known.rs` — whether webhooks' payments are recorded, many asked in one statement
//! - `request.rs` — parsing and validating an order request
//! - `view.rs` — the API's resources
//! - `auth.rs`, `limits.rs` — bearer tokens, rate and hold limits
//! - `issued.rs` — every issued token's digest prefix, in memory: made-up tokens refused without a lookup
//! - `error.rs` — `ApiError`, every problem response rendered in one place
//! - `logging.rs` — each error response logged once, with the request's ids
//! - `metric_help.rs` — what each metric it records means

mod metric_help;
pub use metric_help::METRICS;
mod admin;
mod auth;
mod coalesce;
pub use coalesce::Coalesce;
mod disputes;
mod error;
mod issued;
mod known;
pub mod limits;
mod logging;
mod orders;
mod place;
mod reply;
// Public for the property tests in tests/fuzz only; not an API.
#[doc(hidden)]
pub mod request;
mod view;
mod webhook_payload;
mod webhook_slots;
// Public for the property tests in tests/fuzz only; not an API.
#[doc(hidden)]
pub mod webhooks;

pub use webhooks::Secrets;

pub use limits::Limits;
pub use platform::http::HttpLimits;
pub use view::OrderView;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use platform::app::{self, App};
use platform::config::{self, ConfigError};
use platform::ops::ReadinessCheck;
use sqlx::PgPool;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Largest request head (target and headers) accepted: `431` beyond it.
pub const MAX_HEAD_BYTES: usize = 256 * 1024;

/// Refuses a request whose head is larger than [`MAX_HEAD_BYTES`] before anything reads it.
async fn bound_head(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let head = request.uri().to_string().len()
        + request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if head > MAX_HEAD_BYTES {
        metrics::counter!("soldonce_checkout_requests_total", "outcome" => "head_too_large")
            .increment(1);
        return error::ApiError::HeadTooLarge.into_response();
    }
    next.run(request).await
}

/// checkout's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `CHECKOUT_ADDR`, default `127.0.0.1:8080`; port 0 picks a free port.
    pub addr: SocketAddr,
    /// `CHECKOUT_OPS_ADDR`: when set, `/healthz`, `/readyz` and `/metrics`
    /// are served there only, apart from the public API.
    pub ops_addr: Option<SocketAddr>,
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `RESERVATION_TTL`, default 15 minutes: how long a reservation waits for payment.
    pub reservation_ttl: Duration,
    /// `DATABASE_POOL_SIZE`, default 32: the bound on concurrent transactions.
    pub pool_size: u32,
    /// `WEBHOOK_SECRET`: the PSP's signing secrets (`whsec_…`, space-separated
    /// during a rotation); without it `/v1/psp/webhooks` is not served.
    pub webhook_secrets: Option<Secrets>,
    /// Abuse limits (see [`Limits`]).
    pub limits: Limits,
    /// How placements are grouped into transactions (see [`Coalesce`]).
    pub coalesce: Coalesce,
    /// Connection limits of the API and ops ports (`HTTP_*`, see [`HttpLimits`]).
    pub http: HttpLimits,
    /// `CHECKOUT_ADMIN_TOKEN`: the operators' token for `/admin/v1/…`
    /// (operator refunds and cancels); without it those routes answer `404`.
    pub admin_token: Option<String>,
    /// `ACTION_EXTENSION`, default 10 minutes: how much longer a
    /// reservation lasts, once, while its buyer completes 3-D Secure (a
    /// `payment.requires_action` webhook may tell checkout first).
    pub action_extension: Duration,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let pool_size = config::var(
            "DATABASE_POOL_SIZE",
            "checkout's PostgreSQL connections: the bound on its concurrent transactions",
        )
        .parsed(32u32)?;
        if pool_size == 0 {
            return Err(ConfigError::new("DATABASE_POOL_SIZE", "must be at least 1"));
        }
        let reservation_ttl = config::var(
            "RESERVATION_TTL",
            "how long a reservation waits for payment before expiry releases it",
        )
        .duration(Duration::from_secs(15 * 60))?;
        if reservation_ttl.is_zero() {
            return Err(ConfigError::new(
                "RESERVATION_TTL",
                "must be longer than zero",
            ));
        }
        Ok(Settings {
            addr: config::var(
                "CHECKOUT_ADDR",
                "where the API (and, without CHECKOUT_OPS_ADDR, /healthz /readyz /metrics) listens; port 0 picks a free port",
            )
            .parsed(SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            ops_addr: config::var(
                "CHECKOUT_OPS_ADDR",
                "when set, /healthz /readyz /metrics are served only there, apart from the API",
            )
            .optional()?
                .map(|a| {
                    a.trim().parse().map_err(|e| {
                        ConfigError::new("CHECKOUT_OPS_ADDR", format!("cannot parse {a:?}: {e}"))
                    })
                })
                .transpose()?,
            database_url: config::database_url()?,
            reservation_ttl,
            pool_size,
            webhook_secrets: config::WEBHOOK_SECRET
                .optional()?
                .map(|s| Secrets::parse(&s).map_err(|e| ConfigError::new("WEBHOOK_SECRET", e)))
                .transpose()?,
            action_extension: store::payments::action_extension_setting()?,
            limits: Limits::from_env()?,
            coalesce: Coalesce::from_env()?,
            http: HttpLimits::from_env()?,
            admin_token: config::var(
                "CHECKOUT_ADMIN_TOKEN",
                "the operators' bearer token for /admin/v1/… (operator refunds and cancels), at least 16 characters; unset: those routes answer 404",
            )
            .optional()?
            .map(|t| {
                if t.chars().count() < 16 {
                    Err(ConfigError::new("CHECKOUT_ADMIN_TOKEN", "must be at least 16 characters"))
                } else {
                    Ok(t)
                }
            })
            .transpose()?,
        })
    }
}

/// The request's W3C `traceparent` in canonical form, or a new trace when it
/// is missing or invalid: never the header's text verbatim.
pub(crate) fn traceparent(headers: &axum::http::HeaderMap) -> String {
    platform::trace::TraceParent::from_header(
        headers.get("traceparent").and_then(|v| v.to_str().ok()),
    )
    .to_string()
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub pool: PgPool,
    pub placer: Arc<coalesce::Placer>,
    pub tokens: Arc<auth::TokenCache>,
    /// Which tokens were issued: an unknown one is refused without a lookup.
    pub issued: Arc<issued::IssuedTokens>,
    pub limiter: Arc<limits::Limiter>,
    pub webhook_secrets: Option<Arc<Secrets>>,
    /// The digest of `CHECKOUT_ADMIN_TOKEN`, if the admin API is on.
    pub admin_token: Option<Arc<[u8; 32]>>,
    /// Webhooks writing at once: a quarter of the pool (their looks share one connection).
    pub webhook_slots: Arc<tokio::sync::Semaphore>,
    /// Whether webhooks' payments are recorded, many asked at once.
    pub known_payments: Arc<known::KnownPayments>,
}

/// A bound, ready-to-run checkout.
pub struct Application {
    listener: TcpListener,
    router: Router,
    /// The operations endpoints' own listener and readiness check, when apart.
    ops: Option<(TcpListener, ReadinessCheck)>,
    /// Connection limits of both ports.
    http: HttpLimits,
}

impl Application {
    /// Connects to the database and binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        platform::metric::describe(&[platform::metric::METRICS, store::METRICS, METRICS]);
        store::payments::set_action_extension(settings.action_extension);
        let pool = store::connect_with_settings(
            &settings.database_url,
            settings.pool_size,
            store::timeouts::CHECKOUT,
        )
        .await
        .context("connecting to DATABASE_URL")?;
        let listener = app::bind(settings.addr).await?;
        let ttl = chrono::Duration::from_std(settings.reservation_ttl)
            .context("RESERVATION_TTL is too long")?;
        let ready = store::readiness(pool.clone());
        let limiter = Arc::new(limits::Limiter::new(settings.limits));
        let placer = coalesce::Placer::new(
            place::Context {
                pool: pool.clone(),
                ttl,
                limiter: limiter.clone(),
            },
            settings.coalesce,
        )
        .context("starting the placing lanes")?;
        let issued = Arc::new(issued::IssuedTokens::start(pool.clone()));
        let state = AppState {
            known_payments: Arc::new(known::KnownPayments::start(pool.clone())),
            pool,
            placer: Arc::new(placer),
            tokens: Arc::default(),
            issued,
            limiter,
            webhook_secrets: settings.webhook_secrets.map(Arc::new),
            admin_token: settings
                .admin_token
                .as_deref()
                .map(|t| Arc::new(admin::digest(t))),
            webhook_slots: Arc::new(tokio::sync::Semaphore::new(
                (settings.pool_size as usize / 4).max(1),
            )),
        };
        let ops = match settings.ops_addr {
            Some(addr) => {
                let ops_listener = app::bind(addr).await.context("CHECKOUT_OPS_ADDR")?;
                Some((ops_listener, ready.clone()))
            }
            None => None,
        };
        let router = match ops {
            Some(_) => api_router(state),
            None => api_router(state).merge(platform::ops::router(ready)),
        }
        .route_layer(axum::middleware::from_fn(platform::ops::http_metrics))
        .layer(axum::middleware::from_fn(bound_head))
        .layer(axum::middleware::from_fn(logging::log_errors));
        Ok(Application {
            listener,
            router,
            ops,
            http: settings.http,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        app::local_addr(&self.listener)
    }

    /// The operations endpoints' address, when they listen apart.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then finishes in-flight requests.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let mut app =
            App::new()
                .http_limits(self.http)
                .serve("api server", self.listener, self.router);
        if let Some((listener, ready)) = self.ops {
            app = app.ops(listener, ready);
        }
        app.run_until(shutdown).await?;
        Ok(())
    }
}

fn api_router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/orders",
            post(place::place_order).get(orders::list_orders),
        )
        .route("/v1/orders/{id}", get(orders::get_order))
        .route("/v1/orders/{id}/events", get(orders::get_events))
        .route("/v1/orders/{id}/cancel", post(orders::cancel_order))
        .route("/v1/psp/webhooks", post(webhooks::receive))
        .route("/admin/v1/orders/{id}/refunds", post(admin::refund))
        .route("/admin/v1/orders/{id}/cancel", post(admin::cancel))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
