//! The operations endpoints every service serves: `/healthz` (alive),
//! `/readyz` (every dependency the service uses reachable; [`all`] combines
//! one check per dependency) and `/metrics` (Prometheus text).

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
                .and_then(|b| {
                    // Batch and group sizes count items, not seconds.
                    b.set_buckets_for_metric(
                        Matcher::Suffix("_size".into()),
                        &[
                            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                        ],
                    )
                })
                .and_then(|b| {
                    // The relay's lag (commit → claim, commit → PubAck) is judged
                    // against a 25 ms budget: finer steps below 100 ms.
                    b.set_buckets_for_metric(
                        Matcher::Prefix("soldonce_outbox_commit_to_".into()),
                        &[
                            0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025,
                            0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        ],
                    )
                })
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Another recorder may already be installed (tests); rendering still works.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Records every request's duration in
/// `http_server_request_duration_seconds` (OpenTelemetry's semantic
/// conventions, as Prometheus names them), labelled with `http_route` (the
/// route's template, never the raw path, so ids do not multiply series),
/// `http_request_method` and `http_response_status_code`. Use it with
/// `axum::middleware::from_fn`.
pub async fn http_metrics(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    metrics::histogram!(
        "http_server_request_duration_seconds",
        "http_route" => route.clone(),
        "http_request_method" => method,
        "http_response_status_code" => response.status().as_u16().to_string(),
    )
    .record(started.elapsed().as_secs_f64());
    let mut response = response;
    response.extensions_mut().insert(HttpRoute(route));
    response
}

/// The route template a response answered (`/v1/orders/{id}`, or
/// `unmatched`), left on it by [`http_metrics`] for outer layers (the
/// request's span is named by it).
#[derive(Debug, Clone)]
pub struct HttpRoute(pub String);

/// A readiness probe: `Ok` when every dependency answers, else which one failed.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// A readiness check that passes when every one of `checks` does. They
/// run at once; a failure names each dependency that did not answer, in
/// the order given.
pub fn all(checks: impl IntoIterator<Item = ReadinessCheck>) -> ReadinessCheck {
    let checks: Arc<[ReadinessCheck]> = checks.into_iter().collect();
    Arc::new(move || {
        let probes = futures::future::join_all(checks.iter().map(|check| check()));
        Box::pin(async move {
            let failed: Vec<String> = probes.await.into_iter().filter_map(Result::err).collect();
            if failed.is_empty() {
                Ok(())
            } else {
                Err(failed.join("; "))
            }
        })
    })
}

/// The `/healthz`, `/readyz` and `/metrics` routes.
pub fn router<S: Clone + Send + Sync + 'static>(ready: ReadinessCheck) -> Router<S> {
    let handle = metrics_handle();
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({ "status": "ok" })) }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    match ready().await {
                        Ok(()) => (
                            StatusCode::OK,
                            Json(serde_json::json!({ "status": "ready" })),
                        ),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            Json(serde_json::json!({ "status": "unavailable", "reason": why })),
                        ),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move {
                    handle.run_upkeep();
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        handle.render(),
                    )
                        .into_response()
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(answer: Result<(), &'static str>) -> ReadinessCheck {
        Arc::new(move || Box::pin(async move { answer.map_err(str::to_owned) }))
    }

    #[tokio::test]
    async fn all_passes_when_every_check_passes() {
        assert_eq!(all([check(Ok(())), check(Ok(()))])().await, Ok(()));
        assert_eq!(all([])().await, Ok(()));
    }

    #[tokio::test]
    async fn all_names_each_dependency_that_failed_in_order() {
        let nats = check(Err("nats is unreachable"));
        assert_eq!(
            all([check(Ok(())), nats.clone()])().await,
            Err("nats is unreachable".to_owned())
        );
        let postgres = check(Err("postgres is unreachable"));
        assert_eq!(
            all([postgres, check(Ok(())), nats])().await,
            Err("postgres is unreachable; nats is unreachable".to_owned())
        );
    }
}
