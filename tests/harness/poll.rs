//! Waiting without sleeping blind: poll a condition until a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every few milliseconds until it returns `Some`, or panics
/// with `what` after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Waits until `GET url` answers 2xx (a service's `/readyz` or `/healthz`),
/// or panics naming `what` after 30 s.
pub async fn ready(what: &str, url: &str) {
    let client = reqwest::Client::new();
    eventually(
        &format!("{what} to be ready"),
        Duration::from_secs(30),
        || {
            let (client, url) = (client.clone(), url.to_owned());
            async move {
                client
                    .get(url)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| ())
            }
        },
    )
    .await;
}
