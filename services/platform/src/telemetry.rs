//! Logging: JSON lines on stderr, filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::{fmt, EnvFilter};

/// Installs the global subscriber; a second call is a no-op.
pub fn init(service: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let installed = fmt()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    if installed.is_ok() {
        tracing::info!(service, "telemetry ready");
    }
}
