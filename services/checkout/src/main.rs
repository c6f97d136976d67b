//! The checkout binary: config and runtime → telemetry → build → serve until SIGTERM.

use checkout::{Application, Settings};

fn main() -> anyhow::Result<()> {
    platform::runtime::run("checkout", Settings::from_env, |settings| async move {
        let app = Application::build(settings).await?;
        tracing::info!(addr = %app.local_addr(), "checkout listening");
        app.run_until_stopped(platform::shutdown::signal()).await?;
        Ok(())
    })
}
