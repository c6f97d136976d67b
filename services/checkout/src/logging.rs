//! The one place error responses are logged. The middleware resolves the
//! request's trace once (handlers read it back as [`RequestTrace`], so the
//! events they write and the log name the same trace), and logs each
//! response that carries a [`Failure`] once, with the ids the request
//! carries: error level for 5xx, debug for refusals. Every id logged is
//! validated or parsed first; nothing from a request is logged verbatim or
//! unbounded.

use crate::error::Failure;
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use platform::otel::{Hop, Kind};
use platform::trace::TraceParent;
use std::convert::Infallible;
use std::fmt;
use uuid::Uuid;

/// The request's W3C trace in canonical form, as the middleware resolved it.
#[derive(Debug, Clone)]
pub(crate) struct RequestTrace(String, Option<String>);

impl RequestTrace {
    fn of(headers: &HeaderMap) -> RequestTrace {
        RequestTrace(crate::traceparent(headers), tracestate(headers))
    }

    /// The caller's W3C `tracestate`, validated, to forward with the trace.
    pub(crate) fn tracestate(&self) -> Option<String> {
        self.1.clone()
    }

    /// Metadata for what this request causes, on its trace.
    pub(crate) fn meta(&self, correlation_id: Uuid) -> events::Metadata {
        events::Metadata::from_request("checkout", correlation_id, Some(self.0.clone()))
            .with_tracestate(self.tracestate())
    }

    /// The trace id, 32 hex digits.
    pub(crate) fn trace_id(&self) -> Option<String> {
        TraceParent::parse(&self.0).map(|t| t.trace_id())
    }
}

impl fmt::Display for RequestTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RequestTrace {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        // Outside the middleware (a router built without it) the headers still give a trace.
        Ok(parts
            .extensions
            .get::<RequestTrace>()
            .cloned()
            .unwrap_or_else(|| RequestTrace::of(&parts.headers)))
    }
}

/// The request's `tracestate`, if valid.
fn tracestate(headers: &HeaderMap) -> Option<String> {
    platform::trace::tracestate(headers.get("tracestate").and_then(|v| v.to_str().ok()))
}

/// Longest path logged, in characters.
const MAX_LOGGED_PATH: usize = 200;

/// The ids a request carries, parsed, for its log line.
struct RequestIds {
    method: String,
    path: String,
    trace_id: Option<String>,
    order_id: Option<Uuid>,
    idempotency_key: Option<String>,
    webhook_id: Option<String>,
}

impl RequestIds {
    fn of(request: &Request, trace: &RequestTrace) -> RequestIds {
        let path = request.uri().path();
        let headers = request.headers();
        RequestIds {
            method: request.method().as_str().chars().take(16).collect(),
            path: path.chars().take(MAX_LOGGED_PATH).collect(),
            trace_id: trace.trace_id(),
            // The order routes are /v1/orders/{id}[/...].
            order_id: path
                .strip_prefix("/v1/orders/")
                .and_then(|rest| rest.split('/').next())
                .and_then(|id| Uuid::parse_str(id).ok()),
            idempotency_key: crate::request::idempotency_key(headers).ok(),
            webhook_id: headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|id| {
                    !id.is_empty() && id.len() <= 255 && id.bytes().all(|b| b.is_ascii_graphic())
                })
                .map(str::to_owned),
        }
    }
}

/// Resolves the request's trace for the handlers, then logs the response
/// once if it is an error.
pub(crate) async fn log_errors(mut request: Request, next: Next) -> Response {
    // The request's server span: what the handlers write (events, their
    // outbox rows) continues it.
    let mut hop = Hop::continuing(
        Kind::Server,
        request.method().as_str().to_owned(),
        request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok()),
    )
    .with_tracestate(tracestate(request.headers()));
    let trace = RequestTrace(
        hop.traceparent().to_string(),
        hop.tracestate().map(str::to_owned),
    );
    let ids = RequestIds::of(&request, &trace);
    request.extensions_mut().insert(trace);
    let mut response = next.run(request).await;
    if platform::otel::enabled() {
        let route = response
            .extensions()
            .get::<platform::ops::HttpRoute>()
            .map_or("unmatched", |r| r.0.as_str())
            .to_owned();
        hop.rename(format!("{} {route}", ids.method));
        hop.attribute("http.request.method", ids.method.clone());
        hop.attribute("http.route", route);
        hop.attribute(
            "http.response.status_code",
            i64::from(response.status().as_u16()),
        );
        if response.status().is_server_error() {
            hop.fail(response.status());
        }
    }
    drop(hop);
    let Some(Failure(cause)) = response.extensions_mut().remove::<Failure>() else {
        return response;
    };
    let status = response.status().as_u16();
    let RequestIds {
        method,
        path,
        trace_id,
        order_id,
        idempotency_key,
        webhook_id,
    } = ids;
    if response.status().is_server_error() {
        tracing::error!(
            status,
            method,
            path,
            trace_id,
            order_id = order_id.map(tracing::field::display),
            idempotency_key,
            webhook_id,
            %cause,
            "request failed"
        );
    } else {
        tracing::debug!(
            status,
            method,
            path,
            trace_id,
            order_id = order_id.map(tracing::field::display),
            idempotency_key,
            webhook_id,
            %cause,
            "request refused"
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use std::sync::{Arc, Mutex};
    use tower::Service;
    use tracing::field::{Field, Visit};
    use tracing::{span, Event, Level, Metadata, Subscriber};

    /// One captured event: its level and its fields as `name=value` text.
    type Captured = Arc<Mutex<Vec<(Level, String)>>>;

    /// A subscriber that keeps every event, for this thread only.
    struct Capture(Captured);

    struct Fields<'a>(&'a mut String);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut text = String::new();
            event.record(&mut Fields(&mut text));
            if let Ok(mut events) = self.0.lock() {
                events.push((*event.metadata().level(), text));
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const ORDER: &str = "0190a0b4-51c5-7a9e-8d3f-6c1e2b3a4d5f";

    fn router() -> Router {
        Router::new()
            .route(
                "/v1/orders/{id}",
                get(|| async { ApiError::Internal("pool at 10.0.0.7 exploded".into()) }),
            )
            .route(
                "/v1/orders",
                get(|| async { ApiError::OutOfStock(domain::Sku::parse("SKU-1").expect("sku")) }),
            )
            .route(
                "/trace",
                get(|trace: RequestTrace| async move { trace.to_string() }),
            )
            .route(
                "/trace/fails",
                get(|trace: RequestTrace| async move { ApiError::Internal(trace.to_string()) }),
            )
            .layer(axum::middleware::from_fn(log_errors))
    }

    /// Sends one request through the router and returns the response, its
    /// body, and what was logged meanwhile.
    async fn send(request: Request) -> (Response, String, Vec<(Level, String)>) {
        let captured = Captured::default();
        let _guard = tracing::subscriber::set_default(Capture(captured.clone()));
        let response = router().call(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
        let logged = captured.lock().expect("lock").clone();
        (
            Response::from_parts(parts, Body::empty()),
            String::from_utf8_lossy(&bytes).into_owned(),
            logged,
        )
    }

    #[tokio::test]
    async fn a_failed_request_is_logged_once_with_its_ids_and_its_body_says_nothing_internal() {
        let request = Request::get(format!("/v1/orders/{ORDER}"))
            .header("traceparent", TRACE)
            .header("idempotency-key", "key-42")
            .body(Body::empty())
            .expect("request");
        let (response, body, logged) = send(request).await;
        assert_eq!(response.status(), 500);
        assert!(!body.contains("10.0.0.7"), "{body}");
        assert!(
            response.extensions().get::<Failure>().is_none(),
            "taken off"
        );
        assert_eq!(logged.len(), 1, "{logged:?}");
        let (level, line) = &logged[0];
        assert_eq!(*level, Level::ERROR);
        for expected in [
            "status=500",
            "trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"",
            &format!("order_id={ORDER}"),
            "idempotency_key=\"key-42\"",
            "cause=internal error: pool at 10.0.0.7 exploded",
        ] {
            assert!(line.contains(expected), "{expected} in {line}");
        }
    }

    #[tokio::test]
    async fn a_refusal_is_logged_once_below_error_level() {
        let request = Request::get("/v1/orders")
            .header("idempotency-key", "bad key\twith a tab")
            .body(Body::empty())
            .expect("request");
        let (response, body, logged) = send(request).await;
        assert_eq!(response.status(), 409);
        assert!(body.contains("\"sku\":\"SKU-1\""), "{body}");
        assert_eq!(logged.len(), 1, "{logged:?}");
        let (level, line) = &logged[0];
        assert_eq!(*level, Level::DEBUG);
        assert!(line.contains("cause=out of stock: SKU-1"), "{line}");
        assert!(
            !line.contains("idempotency_key"),
            "an invalid key is not logged: {line}"
        );
    }

    #[tokio::test]
    async fn a_success_is_not_logged_and_the_handler_sees_the_requests_trace() {
        let request = Request::get("/trace")
            .header("traceparent", TRACE)
            .body(Body::empty())
            .expect("request");
        let (response, body, logged) = send(request).await;
        assert_eq!(response.status(), 200);
        assert!(logged.is_empty(), "{logged:?}");
        // The caller's trace, under the request's own span.
        let handed = TraceParent::parse(&body).expect("a valid traceparent");
        let caller = TraceParent::parse(TRACE).expect("valid");
        assert_eq!(handed.trace_id(), caller.trace_id());
        assert_ne!(handed.ids().1, caller.ids().1, "{body}");
    }

    #[tokio::test]
    async fn without_a_traceparent_the_handler_and_the_log_name_the_same_new_trace() {
        let request = Request::get("/trace/fails")
            .body(Body::empty())
            .expect("request");
        let (_, _, logged) = send(request).await;
        assert_eq!(logged.len(), 1, "{logged:?}");
        let line = &logged[0].1;
        let handed = line
            .split("cause=internal error: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(TraceParent::parse)
            .unwrap_or_else(|| panic!("the handler's trace in {line}"));
        assert!(
            line.contains(&format!("trace_id=\"{}\"", handed.trace_id())),
            "{line}"
        );
    }
}
