//! `/readyz` checks exactly the dependencies a service uses: with NATS gone,
//! the services that use it (outbox-relay, payment-worker, fulfillment) say
//! so by name and nothing more, the ones that do not (checkout, expiry) stay
//! ready, and every one is ready again once NATS is back.

use soldonce_tests::eventually;
use soldonce_tests::system::System;
use std::time::Duration;

/// The services that use NATS, and those that do not.
const NATS_USERS: &[&str] = &["outbox-relay", "payment-worker", "fulfillment"];
const NATS_FREE: &[&str] = &["checkout", "expiry"];

/// A service's `/readyz`: (status, body).
async fn readyz(system: &System, service: &str) -> (u16, serde_json::Value) {
    let response = reqwest::get(format!("{}/readyz", system.url(service)))
        .await
        .expect("readyz answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// Waits until `service`'s `/readyz` answers `want`.
async fn await_readyz(system: &System, service: &str, want: (u16, serde_json::Value)) {
    eventually(
        &format!("{service}'s /readyz to answer {want:?}"),
        Duration::from_secs(30),
        || {
            let want = want.clone();
            async move { (readyz(system, service).await == want).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_naming_nats_while_it_is_down_and_200_once_it_is_back() {
    let mut system = System::start().await;
    let ready = (200, serde_json::json!({ "status": "ready" }));
    let nats_down = (
        503,
        serde_json::json!({ "status": "unavailable", "reason": "nats is unreachable" }),
    );
    for service in NATS_USERS.iter().chain(NATS_FREE) {
        assert_eq!(
            readyz(&system, service).await,
            ready,
            "{service} starts ready"
        );
    }

    system.nats.stop();
    for service in NATS_USERS {
        await_readyz(&system, service, nats_down.clone()).await;
    }
    for service in NATS_FREE {
        assert_eq!(
            readyz(&system, service).await,
            ready,
            "{service} does not use NATS"
        );
    }

    system.nats.restart().expect("restart nats");
    for service in NATS_USERS {
        await_readyz(&system, service, ready.clone()).await;
    }
}
