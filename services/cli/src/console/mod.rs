//! `soldonce console`: a live, read-only web page for operators. The page
//! and its scripts are public and hold no data; every figure comes from
//! `GET /api/figures`, which takes the operator token (`CONSOLE_TOKEN`) as a
//! bearer token. The page reads the token from its URL fragment
//! (`/#token=…`, never sent to the server) or a form, keeps it for the tab
//! only, and polls once a second. Charts are drawn with uPlot (MIT,
//! vendored in `assets/`).

use crate::CliError;
use anyhow::Context;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::RwLock;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const UPLOT_JS: &str = include_str!("assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("assets/uPlot.min.css");

/// The shortest operator token accepted.
const MIN_TOKEN: usize = 24;
/// How many one-second samples of the event rates the console keeps.
const KEEP_SAMPLES: usize = 300;
/// The outcomes charted, each the stem of its event type.
const OUTCOMES: [&str; 6] = [
    "order.placed",
    "order.confirmed",
    "order.payment_failed",
    "order.expired",
    "order.cancelled",
    "order.refunded",
];
/// The consumers whose lag the console shows.
const CONSUMERS: [&str; 2] = ["payment-worker", "fulfillment"];

#[derive(Debug, clap::Args)]
pub struct ConsoleArgs {
    /// Where to listen (port 0 picks a free port, printed at start).
    #[arg(long, env = "CONSOLE_ADDR", default_value = "127.0.0.1:8095")]
    addr: SocketAddr,
    /// How often the console runs the incremental audit itself (0 = never: it
    /// shows the last run recorded, by expiry's periodic audit or `soldonce audit`).
    #[arg(long, env = "CONSOLE_AUDIT_INTERVAL", default_value = "0s", value_parser = humantime::parse_duration)]
    audit_interval: Duration,
}

/// How often the console reads the last recorded audit.
const AUDIT_READ_EVERY: Duration = Duration::from_secs(2);

/// The last recorded audit.
#[derive(Debug, Clone, Serialize)]
struct AuditSummary {
    at: chrono::DateTime<chrono::Utc>,
    /// `full` or `incremental`.
    kind: String,
    violations: i64,
    /// Violations by check.
    checks: BTreeMap<String, u64>,
    seconds: f64,
}

/// A consumer's lag, from JetStream.
#[derive(Debug, Clone, Serialize)]
struct Lag {
    pending: u64,
    ack_pending: u64,
}

/// Events of each charted outcome per second, over one sampling interval.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    at: chrono::DateTime<chrono::Utc>,
    per_second: BTreeMap<&'static str, f64>,
}

#[derive(Serialize)]
struct Page {
    #[serde(flatten)]
    figures: store::console::Figures,
    /// `None` where NATS is not configured or not answering.
    consumers: Option<BTreeMap<String, Lag>>,
    audit: Option<AuditSummary>,
    /// The last five minutes of rates, oldest first.
    rates: Vec<Sample>,
}

struct Console {
    pool: sqlx::PgPool,
    js: Option<async_nats::jetstream::Context>,
    token: String,
    audit: RwLock<Option<AuditSummary>>,
    rates: RwLock<std::collections::VecDeque<Sample>>,
}

pub async fn run(args: ConsoleArgs) -> Result<std::process::ExitCode, CliError> {
    let token = std::env::var("CONSOLE_TOKEN").unwrap_or_default();
    if token.trim().len() < MIN_TOKEN {
        return Err(CliError::Usage(format!(
            "CONSOLE_TOKEN must be set to an operator token of at least {MIN_TOKEN} characters"
        )));
    }
    // The console is a port like checkout's: the same connection hygiene.
    let limits =
        platform::http::HttpLimits::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
    let pool = crate::database::pool().await?;
    let js = match std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => Some(bus::connect(&url).await.context("connecting to NATS_URL")?),
        None => None,
    };
    let console = Arc::new(Console {
        pool,
        js,
        token: token.trim().to_owned(),
        audit: RwLock::new(None),
        rates: RwLock::new(std::collections::VecDeque::new()),
    });
    tokio::spawn(sample_rates(console.clone()));
    tokio::spawn(read_audits(console.clone()));
    if !args.audit_interval.is_zero() {
        tokio::spawn(audit_loop(console.pool.clone(), args.audit_interval));
    }
    let app = Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/assets/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/assets/uPlot.iife.min.js",
            get(|| async { asset("text/javascript; charset=utf-8", UPLOT_JS) }),
        )
        .route(
            "/assets/uPlot.min.css",
            get(|| async { asset("text/css; charset=utf-8", UPLOT_CSS) }),
        )
        .route("/api/figures", get(figures))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(console);
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("listening on {}", args.addr))?;
    let addr = listener.local_addr().context("local address")?;
    eprintln!("console: http://{addr}/  (open http://{addr}/#token=<CONSOLE_TOKEN>)");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // Ctrl-C or SIGTERM (`docker stop` sends SIGTERM to PID 1).
        platform::shutdown::signal().await;
        stop.send_replace(true);
    });
    platform::http::serve(listener, app, limits, stopped)
        .await
        .context("serving the console")?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// A problem+json answer (RFC 9457).
fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = (status, Json(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/problem+json"),
    );
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"soldonce console\""),
        );
    }
    response
}

/// Compares in time that does not depend on where the texts differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

async fn figures(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|t| same(t.trim(), &console.token)) {
        return problem(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "send the operator token (CONSOLE_TOKEN) as a bearer token",
        );
    }
    let figures = match store::console::figures(&console.pool).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "console: reading the figures failed");
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable",
                "the database did not answer; the page tries again",
            );
        }
    };
    let consumers = match &console.js {
        Some(js) => lag(js).await,
        None => None,
    };
    let audit = console.audit.read().await.clone();
    let rates = console.rates.read().await.iter().cloned().collect();
    let mut response = Json(Page {
        figures,
        consumers,
        audit,
        rates,
    })
    .into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

async fn lag(js: &async_nats::jetstream::Context) -> Option<BTreeMap<String, Lag>> {
    let mut lags = BTreeMap::new();
    for name in CONSUMERS {
        let consumer = js
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                name,
                bus::STREAM,
            )
            .await;
        let Ok(mut consumer) = consumer else { continue };
        if let Ok(info) = consumer.info().await {
            lags.insert(
                name.to_owned(),
                Lag {
                    pending: info.num_pending,
                    ack_pending: info.num_ack_pending as u64,
                },
            );
        }
    }
    Some(lags)
}

/// Runs the incremental audit every `every` and records it (shown like any other run).
async fn audit_loop(pool: sqlx::PgPool, every: Duration) {
    let options = store::audit::AuditOptions::default();
    loop {
        match store::audit::incremental(&pool, &options).await {
            Ok(audit) => {
                if let Err(e) = audit.record(&pool).await {
                    tracing::warn!(error = %e, "console: the audit could not be recorded");
                }
            }
            Err(e) => tracing::warn!(error = %e, "console: the audit failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Keeps the last recorded audit at hand for the page.
async fn read_audits(console: Arc<Console>) {
    loop {
        match store::audit::last(&console.pool).await {
            Ok(Some(run)) => {
                *console.audit.write().await = Some(AuditSummary {
                    at: run.started_at,
                    kind: run.kind,
                    violations: run.violation_count,
                    checks: run.checks,
                    seconds: run.seconds,
                });
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "console: reading the last audit failed"),
        }
        tokio::time::sleep(AUDIT_READ_EVERY).await;
    }
}

/// Samples the event rates once a second from the event store (new events
/// by type, read by position), so a page opened now shows the last minutes.
async fn sample_rates(console: Arc<Console>) {
    let mut last: Option<(i64, std::time::Instant)> = None;
    loop {
        match store::console::events_since(&console.pool, last.map(|l| l.0)).await {
            Ok((position, counts)) => {
                let now = std::time::Instant::now();
                if let Some((_, then)) = last {
                    let seconds = now.duration_since(then).as_secs_f64().max(0.001);
                    let mut per_second: BTreeMap<&'static str, f64> =
                        OUTCOMES.iter().map(|o| (*o, 0.0)).collect();
                    for (event_type, n) in counts {
                        let name = events::names::type_name(&event_type).unwrap_or(&event_type);
                        let stem = events::names::stem(name);
                        if let Some(slot) = per_second.get_mut(stem) {
                            *slot += n as f64 / seconds;
                        }
                    }
                    let mut rates = console.rates.write().await;
                    rates.push_back(Sample {
                        at: chrono::Utc::now(),
                        per_second,
                    });
                    while rates.len() > KEEP_SAMPLES {
                        rates.pop_front();
                    }
                }
                last = Some((position, now));
            }
            Err(e) => tracing::warn!(error = %e, "console: sampling the event rates failed"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
