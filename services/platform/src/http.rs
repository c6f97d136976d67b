//! Serving HTTP on a public port with connection hygiene: a client that
//! opens connections and stalls holds no file descriptor for long. HTTP/1.1
//! only (hyper's `http1` server: nothing here speaks HTTP/2, and hyper's
//! automatic HTTP/2 detection has no timer of its own), with
//! - a header-read timeout (hyper's): from the moment a connection can take
//!   a request (just opened, or its previous response sent) until the
//!   request head is complete — a half-sent head is closed when it passes;
//! - a request body timeout (tower-http's `TimeoutBody`): the longest pause
//!   between two pieces of a body;
//! - an idle keep-alive timeout: a connection with no request in progress
//!   for this long is closed (gracefully, between requests);
//! - a cap on open connections (a semaphore taken before `accept`: past it,
//!   new connections wait in the kernel's backlog, not in memory).
//!
//! On stop, connections finish the request in hand and close; the serve
//! returns once every one of them has.

use crate::config::{self, ConfigError};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// A public port's connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// `HTTP_HEADER_READ_TIMEOUT`, default 10 s.
    pub header_read_timeout: Duration,
    /// `HTTP_BODY_TIMEOUT`, default 10 s.
    pub body_timeout: Duration,
    /// `HTTP_IDLE_TIMEOUT`, default 5 s.
    pub idle_timeout: Duration,
    /// `HTTP_MAX_CONNECTIONS`, default 1024.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            max_connections: 1024,
        }
    }
}

impl HttpLimits {
    /// Reads the limits from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let d = HttpLimits::default();
        let positive = |name: &'static str, meaning: &'static str, default: Duration| {
            let value = config::var(name, meaning).duration(default)?;
            if value.is_zero() {
                return Err(ConfigError::new(name, "must be longer than zero"));
            }
            Ok(value)
        };
        let max_connections = config::var(
            "HTTP_MAX_CONNECTIONS",
            "open connections a port serves at once; more wait in the kernel's backlog (keep it below the open-file limit)",
        )
        .parsed(d.max_connections)?;
        if max_connections == 0 {
            return Err(ConfigError::new(
                "HTTP_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        Ok(HttpLimits {
            header_read_timeout: positive(
                "HTTP_HEADER_READ_TIMEOUT",
                "how long a connection may take to send a request head, counted from when it can send one (opened, or its previous response sent); then it is closed",
                d.header_read_timeout,
            )?,
            body_timeout: positive(
                "HTTP_BODY_TIMEOUT",
                "the longest pause between two pieces of a request body; then the request fails",
                d.body_timeout,
            )?,
            idle_timeout: positive(
                "HTTP_IDLE_TIMEOUT",
                "how long a keep-alive connection may stay idle between requests before it is closed",
                d.idle_timeout,
            )?,
            max_connections,
        })
    }
}

/// Serves `router` on `listener` within `limits` until `stop` turns true,
/// then lets every connection finish its request in hand and close.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = stopped(&mut stop) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was
                    // taken: wait a little rather than spin, as axum does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(
            stream,
            router.clone(),
            limits,
            stop.clone(),
            permit,
        ));
    }
    drop(listener);
    // Every connection holds a slot until it closes: all back means all closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// When a connection last finished a request, and how many it has in progress.
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    /// When the connection will have been idle for `idle`, if it stays so.
    fn idle_deadline(&self, idle: Duration) -> Instant {
        let now = Instant::now();
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return now + idle;
        }
        self.last.lock().map(|l| *l + idle).unwrap_or(now + idle)
    }

    fn end(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one connection until it closes: by the client, by a timeout, or
/// gracefully when idle too long or when the service stops.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let seen = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let (router, activity) = (router.clone(), seen.clone());
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        let request = request.map(|body| {
            axum::body::Body::new(tower_http::timeout::TimeoutBody::new(
                limits.body_timeout,
                body,
            ))
        });
        async move {
            let response = router.oneshot(request).await;
            activity.end();
            response
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let idle_at = activity.idle_deadline(limits.idle_timeout);
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection closed");
                }
                return;
            }
            () = stopped(&mut stop), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(idle_at), if !closing => {
                if activity.idle_deadline(limits.idle_timeout) <= Instant::now() {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Resolves once `stop` is true (holding no borrow of it after).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
