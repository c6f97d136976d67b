//! The psp-sim binary: config and runtime → telemetry → build → serve until Ctrl-C or SIGTERM.

use psp_sim::{Application, Settings};

fn main() -> anyhow::Result<()> {
    let about = "a payment provider simulator for soldonce (its API: proto/psp-sim.openapi.yaml)";
    platform::runtime::run_program(
        "psp-sim",
        about,
        Settings::from_env,
        |settings| async move {
            let app = Application::build(settings).await?;
            tracing::info!(addr = %app.local_addr(), "psp-sim listening");
            app.run_until_stopped(platform::shutdown::signal()).await?;
            Ok(())
        },
    )
}
