//! The payment worker's PSP client against psp-sim: its connections.

use soldonce_tests::metric_sample;
use soldonce_tests::saga::{psp_sim_metrics, spawn_psp_sim};
use std::time::Duration;
use uuid::Uuid;

/// A worker with many orders in hand makes as many PSP calls at once: its
/// client keeps a connection alive for each, so the next round of calls
/// opens none (a client keeping fewer idle, as it once kept 64, closes the
/// rest after each round and opens them again: connection churn on both
/// sides at every batch). Counted two ways: psp-sim's accepted connections,
/// and every charge answered `succeeded` by the client and by psp-sim's books.
#[tokio::test]
async fn the_psp_client_keeps_a_connection_alive_for_each_call_in_flight() {
    const AT_ONCE: usize = 100;
    let (psp_url, stop) = spawn_psp_sim(psp_sim::Settings {
        addr: "127.0.0.1:0".parse().expect("addr"),
        webhook: None,
        // Long enough that every call of a round is in flight at once.
        faults: psp_sim::Faults::from_json(r#"{"latency_ms": 100}"#).expect("faults"),
        data_dir: None,
        public_url: None,
    })
    .await;
    let client = payments::psp::Psp::new(
        &psp_url,
        Duration::from_secs(5),
        Duration::from_secs(20),
        AT_ONCE,
    )
    .expect("psp client")
    // Charges that take the money at once, counted by psp-sim as succeeded.
    .capturing_at(payments::psp::CaptureAt::Confirmation);

    let mut accepted = vec![];
    let mut books = String::new();
    for _ in 0..2 {
        let answers = futures::future::join_all(
            (0..AT_ONCE).map(|_| client.pay(Uuid::now_v7(), 1_000, "EUR", None)),
        )
        .await;
        for answer in answers {
            assert_eq!(answer.expect("a PSP answer").status, "succeeded");
        }
        // Read over a connection of its own: each read counts one more.
        books = psp_sim_metrics(&psp_url).await;
        accepted.push(
            metric_sample(&books, "psp_sim_connections_accepted_total")
                .expect("psp_sim_connections_accepted_total in /metrics"),
        );
    }
    let _ = stop.send(());
    // The first round opened at most one connection per call (and the read of the count one).
    assert!(
        accepted[0] <= AT_ONCE as f64 + 1.0,
        "{} connections for {AT_ONCE} calls",
        accepted[0]
    );
    assert_eq!(
        accepted[1] - accepted[0],
        1.0,
        "the second round of {AT_ONCE} calls opened connections instead of reusing them \
         (the count's own read is the 1 expected): {accepted:?}"
    );
    assert_eq!(
        metric_sample(&books, r#"psp_sim_payments_total{status="succeeded"}"#),
        Some(2.0 * AT_ONCE as f64),
        "psp-sim's books: {books}"
    );
}
