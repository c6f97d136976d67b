//! Runtime pieces every soldonce service shares: configuration from the
//! environment with one-line errors, logs (JSON or text), the shutdown signal,
//! the operations endpoints (`/healthz`, `/readyz`, `/metrics`), the run of
//! a service (ops server, tasks, shutdown, join: [`app::App`]) and RFC 9457
//! problem responses. This crate must never know about orders or stock.
//!
//! Layout:
//! - `app.rs` — the runner: ops server, tasks, shutdown, join
//! - `config.rs` — settings from the environment, each declared with its meaning
//! - `http.rs` — serving a port with connection hygiene (timeouts, a connection cap)
//! - `metric.rs` — each metric declared with its meaning (`# HELP`)
//! - `otel.rs` — OpenTelemetry traces: one span per hop an order crosses
//! - `ops.rs` — `/healthz`, `/readyz` (combined checks), `/metrics`
//! - `problem.rs` — RFC 9457 problem responses
//! - `runtime.rs` — the async runtime, sized by `TOKIO_WORKER_THREADS`
//! - `shutdown.rs` — signals and periodic tasks
//! - `telemetry.rs` — logs: JSON lines naming their service, or text
//! - `trace.rs` — W3C trace context

pub mod app;
pub mod config;
pub mod http;
pub mod metric;
pub mod ops;
pub mod otel;
pub mod problem;
pub mod runtime;
pub mod shutdown;
pub mod telemetry;
pub mod trace;

pub use config::ConfigError;
pub use problem::Problem;
