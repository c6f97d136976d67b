//! The payment-worker binary: config and runtime → telemetry → build → consume until SIGTERM.

use payment_worker::{Application, Settings};

fn main() -> anyhow::Result<()> {
    platform::runtime::run(
        "payment-worker",
        Settings::from_env,
        |settings| async move {
            let app = Application::build(settings).await?;
            tracing::info!(addr = %app.local_addr(), "payment-worker running");
            app.run_until_stopped(platform::shutdown::signal()).await?;
            Ok(())
        },
    )
}
