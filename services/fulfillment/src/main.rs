//! The fulfillment binary: config and runtime → telemetry → build → run until SIGTERM.

use fulfillment::{Application, Settings};

fn main() -> anyhow::Result<()> {
    platform::runtime::run("fulfillment", Settings::from_env, |settings| async move {
        let app = Application::build(settings).await?;
        tracing::info!(addr = %app.local_addr(), "fulfillment running");
        app.run_until_stopped(platform::shutdown::signal()).await?;
        Ok(())
    })
}
