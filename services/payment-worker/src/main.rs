//! The payment-worker binary: config → telemetry → build → consume until SIGTERM.

use payment_worker::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::config::load(Settings::from_env);
    platform::telemetry::init("payment-worker");
    let app = Application::build(settings).await?;
    tracing::info!(addr = %app.local_addr(), "payment-worker running");
    app.run_until_stopped(platform::shutdown::signal()).await
}
