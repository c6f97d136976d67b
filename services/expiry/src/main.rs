//! The expiry binary: config → telemetry → build → run until SIGTERM.

use expiry::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::config::load(Settings::from_env);
    platform::telemetry::init("expiry");
    let app = Application::build(settings).await?;
    tracing::info!(addr = %app.local_addr(), "expiry running");
    app.run_until_stopped(platform::shutdown::signal()).await
}
