//! The psp-sim binary: config and runtime → tracing → build → serve until Ctrl-C or SIGTERM.

use std::process::ExitCode;

use psp_sim::{Application, Settings};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let asked = |flag: &str| std::env::args().skip(1).any(|a| a == flag);
    if asked("--version") || asked("-V") {
        println!("psp-sim {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if asked("--help") || asked("-h") {
        let variables: Vec<&str> = psp_sim::settings::VARIABLES
            .iter()
            .chain([&platform::runtime::WORKER_THREADS])
            .copied()
            .collect();
        println!(
            "psp-sim {}: a payment provider simulator for soldonce (its API: proto/psp-sim.openapi.yaml)\n\n\
             Usage: psp-sim [--check-config | --help | --version]\n\n\
             Settings, from the environment (what each means: the README's Configuration table):\n  {}",
            env!("CARGO_PKG_VERSION"),
            variables.join("\n  ")
        );
        return ExitCode::SUCCESS;
    }
    // Both settings, checked once: the first error is what is reported.
    let checked = match (
        Settings::from_env(),
        platform::runtime::worker_threads(),
        platform::otel::settings(),
    ) {
        (Ok(settings), Ok(threads), Ok(exporting)) => Ok((settings, threads, exporting)),
        (Err(e), _, _) => Err(e.to_string()),
        (_, Err(e), _) => Err(e.to_string()),
        (_, _, Err(e)) => Err(e.to_string()),
    };
    if std::env::args().skip(1).any(|a| a == "--check-config") {
        // What a deployment may set, for checking compose files against.
        let reads: serde_json::Map<String, serde_json::Value> = psp_sim::settings::VARIABLES
            .iter()
            .chain([&platform::runtime::WORKER_THREADS])
            .map(|v| ((*v).to_owned(), false.into()))
            .collect();
        let error = checked.err();
        println!(
            "{}",
            serde_json::json!({ "valid": error.is_none(), "error": error, "reads": reads })
        );
        return if error.is_none() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        };
    }
    let (settings, threads, exporting) = match checked {
        Ok(checked) => checked,
        Err(error) => {
            eprintln!("psp-sim: {error}");
            return ExitCode::from(2);
        }
    };
    match platform::runtime::build(threads) {
        Ok(runtime) => {
            let code = runtime.block_on(serve(settings, exporting));
            platform::otel::shutdown();
            code
        }
        Err(error) => {
            eprintln!("psp-sim: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings, exporting: Option<platform::otel::Exporting>) -> ExitCode {
    // JSON lines, like every soldonce service, so one order's trace id can
    // be followed through all of their logs.
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
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
