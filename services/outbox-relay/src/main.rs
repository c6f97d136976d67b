//! The outbox-relay binary: config and runtime → telemetry → build → relay until SIGTERM.

use outbox_relay::{Application, Settings};

fn main() -> anyhow::Result<()> {
    platform::runtime::run("outbox-relay", Settings::from_env, |settings| async move {
        let app = Application::build(settings).await?;
        tracing::info!(addr = %app.local_addr(), "outbox-relay running");
        app.run_until_stopped(platform::shutdown::signal()).await?;
        Ok(())
    })
}
