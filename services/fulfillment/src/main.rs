//! The fulfillment binary: config → telemetry → build → run until SIGTERM.

use fulfillment::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::config::load(Settings::from_env);
    platform::telemetry::init("fulfillment");
    let app = Application::build(settings).await?;
    tracing::info!(addr = %app.local_addr(), "fulfillment running");
    app.run_until_stopped(platform::shutdown::signal()).await
}
