//! The async runtime a service runs on, sized by `TOKIO_WORKER_THREADS`
//! (tokio's own name for it), checked like every other setting: a value
//! that is not a positive integer is a one-line configuration error (exit
//! code 2; `--check-config` reports it) instead of a panic inside tokio.
//!
//! Unset, a service runs one worker thread per core it may use, tokio's
//! default: right for a service alone on its host or in its container.
//! When every service shares one small host (`soldonce up`, the compose
//! file), each extra worker thread mostly adds wake-ups and context
//! switches between the services' threads and PostgreSQL's backends; those
//! launchers give each service one thread (docs/benchmarks.md, "Worker
//! threads").

use crate::config::{self, ConfigError};
use crate::telemetry::Logging;
use std::future::Future;
use std::num::NonZeroUsize;

/// The variable, as tokio names it.
pub const WORKER_THREADS: &str = "TOKIO_WORKER_THREADS";

/// `TOKIO_WORKER_THREADS`: `None` when unset (one per core).
pub fn worker_threads() -> Result<Option<NonZeroUsize>, ConfigError> {
    let threads = config::var(
        WORKER_THREADS,
        "worker threads of the process's async runtime (tokio's own variable); soldonce up and compose give each service its share of the cores",
    )
    .default_shown_as("one per core");
    match threads.optional()? {
        None => Ok(None),
        Some(v) => v.trim().parse::<NonZeroUsize>().map(Some).map_err(|_| {
            ConfigError::new(
                WORKER_THREADS,
                format!("must be a whole number of threads, at least 1, not {v:?}"),
            )
        }),
    }
}

/// A multi-threaded runtime with `threads` workers (one per core when `None`).
pub fn build(threads: Option<NonZeroUsize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // Always set, so tokio never reads (and panics on) the variable itself.
    builder.worker_threads(threads.map_or_else(cores, NonZeroUsize::get));
    builder.build()
}

/// The cores this process may use (at least 1): tokio's default worker count.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// A default for how many transactions a process keeps open at once: one
/// per core it may use, at most `most`. Past the cores, more transactions
/// at once do not run sooner: on a small host (PostgreSQL beside the
/// services) they split the work into smaller batches, each paying its
/// own round trips and wake-ups, and queue for the same cores.
pub fn per_core(most: usize) -> usize {
    cores().clamp(1, most.max(1))
}

/// A service's `main`: answers `--version` and `--help` without starting
/// (config::answer_version_or_help), reads its settings, the runtime's size
/// and the logging settings (as [`config::load`] does: `--check-config`, or
/// one line and exit code 2 on an error), builds the runtime, starts
/// telemetry for `service` and runs `body` on it. The runtime's worker count
/// is exported as the gauge `soldonce_runtime_workers`. An error from `body`
/// is logged as the service's last line, with its causes, and the process
/// exits with code 1.
pub fn run<S, F>(
    service: &'static str,
    read: impl Fn() -> Result<S, ConfigError>,
    body: impl FnOnce(S) -> F,
) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let about = "a service of soldonce, the order saga (every unit sold once, every payment charged once, every order ends)";
    run_program(service, about, read, body)
}

/// [`run`] for a program that describes itself (`--help`) with `about`:
/// psp-sim, which stands in for another company's service.
pub fn run_program<S, F>(
    service: &'static str,
    about: &str,
    read: impl Fn() -> Result<S, ConfigError>,
    body: impl FnOnce(S) -> F,
) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let read_all = || {
        let threads = worker_threads()?;
        let logging = Logging::from_env()?;
        let exporting = crate::otel::settings()?;
        Ok((read()?, threads, logging, exporting))
    };
    if let Some(text) = config::answer_version_or_help(service, about, read_all) {
        println!("{text}");
        return Ok(());
    }
    let (settings, threads, logging, exporting) = config::load(read_all);
    let runtime =
        build(threads).map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(async move {
        crate::telemetry::init(service, &logging);
        crate::otel::start(service, exporting.as_ref()).map_err(|e| anyhow::anyhow!(e))?;
        export_workers();
        // Which build runs where: 1, labelled with the service and its version.
        metrics::gauge!(
            "soldonce_build_info",
            "service" => service,
            "version" => env!("CARGO_PKG_VERSION"),
        )
        .set(1.0);
        body(settings).await
    });
    if let Err(error) = &result {
        // Why the service stops, as one of its log lines (JSON by default)
        // with its causes, not as text after them: `main` returning the
        // error would print it plainly to the same stderr.
        tracing::error!(error = %format!("{error:#}"), "stopped");
    }
    crate::otel::shutdown();
    if result.is_err() {
        std::process::exit(1);
    }
    Ok(())
}

/// Sets `soldonce_runtime_workers` to the current runtime's worker count.
fn export_workers() {
    crate::ops::metrics_handle();
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    metrics::gauge!("soldonce_runtime_workers").set(workers as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_core_default_is_the_cores_this_process_may_use_within_its_bounds() {
        let cores = cores();
        assert_eq!(per_core(64), cores.min(64));
        assert_eq!(per_core(4), cores.min(4));
        assert_eq!(per_core(1), 1);
        // A bound of 0 still leaves one: a process always gets a lane.
        assert_eq!(per_core(0), 1);
    }
}
