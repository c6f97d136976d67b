//! The checkout binary: config → telemetry → build → serve until SIGTERM.

use checkout::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::config::load(Settings::from_env);
    platform::telemetry::init("checkout");
    let app = Application::build(settings).await?;
    tracing::info!(addr = %app.local_addr(), "checkout listening");
    app.run_until_stopped(platform::shutdown::signal()).await?;
    Ok(())
}
