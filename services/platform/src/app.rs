//! One way to run a service: its operations endpoints, HTTP servers and
//! background tasks side by side until a shutdown future resolves; then one
//! stop signal that every task watches, a join of every task, and the first
//! failure as the run's result (so `main` exits 1 on it, 0 otherwise). It
//! must never return while a task it started is still running.

use crate::http::HttpLimits;
use crate::ops::{self, ReadinessCheck};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What every task watches: it turns `true`, once, when the service is to stop.
pub type Stop = watch::Receiver<bool>;

/// A task's error, whatever its type.
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

type Task = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// Why a run failed: the first task, in the order they were added, that did.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the {task} task failed")]
    Failed {
        task: &'static str,
        #[source]
        source: TaskError,
    },
    #[error("the {task} task panicked")]
    Panicked {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// A listener that could not be bound, naming the address.
#[derive(Debug, thiserror::Error)]
#[error("binding {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` (port 0 picks a free port; read it back with [`local_addr`]).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// The address `listener` is bound to.
pub fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// What a task ends with: nothing, or a result whose error fails the run.
pub trait Outcome: Send + 'static {
    /// The outcome as a result.
    fn into_result(self) -> Result<(), TaskError>;
}

impl Outcome for () {
    fn into_result(self) -> Result<(), TaskError> {
        Ok(())
    }
}

impl<E: Into<TaskError> + Send + 'static> Outcome for Result<(), E> {
    fn into_result(self) -> Result<(), TaskError> {
        self.map_err(Into::into)
    }
}

/// A service's run: what it serves and what it works on, each task named.
pub struct App {
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, Task)>,
    http: HttpLimits,
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    /// A run with nothing in it yet.
    pub fn new() -> Self {
        App {
            stop: watch::Sender::new(false),
            tasks: Vec::new(),
            http: HttpLimits::default(),
        }
    }

    /// The connection limits of the servers added after this (default:
    /// [`HttpLimits::default`]).
    pub fn http_limits(mut self, limits: HttpLimits) -> Self {
        self.http = limits;
        self
    }

    /// Serves `/healthz`, `/readyz` (answered by `ready`) and `/metrics` on `listener`.
    pub fn ops(self, listener: TcpListener, ready: ReadinessCheck) -> Self {
        self.serve("ops server", listener, ops::router(ready))
    }

    /// Serves `router` on `listener` within the connection limits
    /// ([`crate::http`]); requests in flight when the service stops are
    /// finished first.
    pub fn serve(self, name: &'static str, listener: TcpListener, router: axum::Router) -> Self {
        let limits = self.http;
        self.task(name, move |stop| {
            crate::http::serve(listener, router, limits, stop)
        })
    }

    /// Adds `task`, handed the stop signal: it should finish the work in
    /// hand and return once the signal turns true. It starts with [`Self::run_until`].
    pub fn task<T, F>(mut self, name: &'static str, task: T) -> Self
    where
        T: FnOnce(Stop) -> F,
        F: Future + Send + 'static,
        F::Output: Outcome,
    {
        let running = task(self.stop.subscribe());
        self.tasks
            .push((name, Box::pin(async move { running.await.into_result() })));
        self
    }

    /// Starts every task, runs until `shutdown` resolves — or until a task
    /// fails or panics before it, since a service missing one of its tasks
    /// (a consumer whose stream ended, a loop that gave up) must not look
    /// healthy: it stops, and its supervisor restarts it — then turns the
    /// stop signal and waits for every task. Returns the first failure; any
    /// later one is logged, so none goes unseen. A task that ends early
    /// without an error (a feature turned off) does not stop the run.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
        let (failed, mut failures) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let running: Vec<_> = self
            .tasks
            .into_iter()
            .map(|(name, task)| {
                let inner = tokio::spawn(task);
                let failed = failed.clone();
                let watched = tokio::spawn(async move {
                    let result = inner.await;
                    if !matches!(result, Ok(Ok(()))) {
                        let _ = failed.send(name);
                    }
                    result
                });
                (name, watched)
            })
            .collect();
        drop(failed);
        tokio::select! {
            () = shutdown => {}
            Some(task) = failures.recv() => {
                tracing::error!(task, "a task failed before shutdown: the service stops, for its supervisor to restart it");
            }
        }
        self.stop.send_replace(true);
        let mut first = None;
        for (task, handle) in running {
            let failure = match handle.await {
                Ok(Ok(Ok(()))) => continue,
                Ok(Ok(Err(source))) => RunError::Failed { task, source },
                Ok(Err(source)) | Err(source) => RunError::Panicked { task, source },
            };
            match first {
                None => first = Some(failure),
                Some(_) => tracing::error!(error = %chain(&failure), "another task failed too"),
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        line.push_str(": ");
        line.push_str(&e.to_string());
        cause = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn every_task_is_stopped_and_joined_before_the_run_returns() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let run = App::new()
            .task("worker", |mut stop| async move {
                let _ = stop.wait_for(|s| *s).await;
                tokio::task::yield_now().await;
                flag.store(true, Ordering::SeqCst);
            })
            .run_until(async {});
        assert!(run.await.is_ok());
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn the_first_failure_in_order_is_the_result_and_names_its_task() {
        let run = App::new()
            .task("fine", |_| async {})
            .task("broken", |_| async {
                Err(std::io::Error::other("disk on fire"))
            })
            .task("also broken", |_| async {
                Err(std::io::Error::other("later"))
            })
            .run_until(async {});
        let error = run.await.expect_err("a task failed");
        assert!(matches!(error, RunError::Failed { task: "broken", .. }));
        assert_eq!(chain(&error), "the broken task failed: disk on fire");
    }

    #[tokio::test]
    async fn a_task_failing_before_shutdown_stops_the_others_and_fails_the_run() {
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let run = App::new()
            .task("steady", |mut stop| async move {
                let _ = stop.wait_for(|s| *s).await;
                flag.store(true, Ordering::SeqCst);
            })
            .task("turned off", |_| async {})
            .task("consumer", |_| async {
                Err(std::io::Error::other("the message stream ended"))
            })
            // A shutdown that never comes: only the failure ends the run.
            .run_until(std::future::pending());
        let error = tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .expect("the run ends on the failure")
            .expect_err("the run fails");
        assert!(matches!(
            error,
            RunError::Failed {
                task: "consumer",
                ..
            }
        ));
        assert!(stopped.load(Ordering::SeqCst), "the other task was stopped");
    }

    fn explode() {
        panic!("boom");
    }

    #[tokio::test]
    async fn a_panicking_task_fails_the_run() {
        let run = App::new()
            .task("panics", |_| async { explode() })
            .run_until(async {});
        let error = run.await.expect_err("a task panicked");
        assert!(matches!(error, RunError::Panicked { task: "panics", .. }));
    }
}
