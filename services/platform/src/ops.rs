//! The operations endpoints every service serves: `/healthz` (alive),
//! `/readyz` (dependencies reachable) and `/metrics` (Prometheus text).

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
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
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Another recorder may already be installed (tests); rendering still works.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// A readiness probe: `Ok` when every dependency answers, else which one failed.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Serves the operations routes on `listener` until `stop` turns true.
pub fn spawn(
    listener: tokio::net::TcpListener,
    ready: ReadinessCheck,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let server = axum::serve(listener, router::<()>(ready)).with_graceful_shutdown(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    tokio::spawn(async move { server.await })
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
