//! The psp-sim binary: config and runtime → tracing → build → serve until Ctrl-C or SIGTERM.

use std::process::ExitCode;

use platform::config;
use platform::telemetry::Logging;
use psp_sim::{Application, Settings};

fn main() -> ExitCode {
    let read = || {
        let threads = platform::runtime::worker_threads()?;
        let logging = Logging::from_env()?;
        let exporting = platform::otel::settings()?;
        Ok((Settings::from_env()?, threads, logging, exporting))
    };
    let about = "a payment provider simulator for soldonce (its API: proto/psp-sim.openapi.yaml)";
    if let Some(text) = config::answer_version_or_help("psp-sim", about, read) {
        println!("{text}");
        return ExitCode::SUCCESS;
    }
    // `--check-config`, or one line naming the variable and exit code 2.
    let (settings, threads, logging, exporting) = config::load(read);
    match platform::runtime::build(threads) {
        Ok(runtime) => {
            let code = runtime.block_on(serve(settings, logging, exporting));
            platform::otel::shutdown();
            code
        }
        Err(error) => {
            eprintln!("psp-sim: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    settings: Settings,
    logging: Logging,
    exporting: Option<platform::otel::Exporting>,
) -> ExitCode {
    // The same lines as every soldonce service, so one order's trace id can
    // be followed through all of their logs.
    platform::telemetry::init("psp-sim", &logging);
    if let Err(error) = platform::otel::start("psp-sim", exporting.as_ref()) {
        tracing::error!(%error, "psp-sim could not start");
        return ExitCode::FAILURE;
    }
    let app = match Application::build(settings).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!(%error, "psp-sim could not start");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(addr = %app.local_addr(), "psp-sim listening");
    match app.run_until_stopped(shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "psp-sim stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM; a signal that cannot be watched never fires.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot watch Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
