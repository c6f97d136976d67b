//! The outbox-relay binary: config → telemetry → build → relay until SIGTERM.

use outbox_relay::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::config::load(Settings::from_env);
    platform::telemetry::init("outbox-relay");
    let app = Application::build(settings).await?;
    tracing::info!(addr = %app.local_addr(), "outbox-relay running");
    app.run_until_stopped(platform::shutdown::signal()).await
}
