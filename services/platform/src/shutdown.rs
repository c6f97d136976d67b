//! The shutdown signal: Ctrl-C or SIGTERM.

/// Resolves when the process is asked to stop. A signal that cannot be
/// watched is logged and never fires.
pub async fn signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot watch Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received, draining"),
        () = term => tracing::info!("SIGTERM received, draining"),
    }
}

/// Runs `task` every `interval` (never, if zero) until `stop` turns true;
/// a run in hand is finished first.
pub async fn every<F, Fut>(
    interval: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut task: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(interval) => {}
        }
        task().await;
    }
}
