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
    wait_ready(what, url, None).await;
}

/// Waits until `GET url` answers 2xx, like [`ready`], unless `child` exits
/// first: then returns false. Panics naming `what` after 30 s.
pub async fn ready_unless_exited(what: &str, url: &str, child: &mut tokio::process::Child) -> bool {
    wait_ready(what, url, Some(child)).await
}

async fn wait_ready(what: &str, url: &str, mut child: Option<&mut tokio::process::Child>) -> bool {
    // Whatever holds the port may accept and never answer.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("HTTP client");
    eventually(
        &format!("{what} to be ready"),
        Duration::from_secs(30),
        || {
            let exited = child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            let (client, url) = (client.clone(), url.to_owned());
            async move {
                if exited {
                    return Some(false);
                }
                client
                    .get(url)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| true)
            }
        },
    )
    .await
}
