//! One trace per order: a buyer's `traceparent` is followed through the JSON
//! logs of checkout, the relay, payment-worker, psp-sim (which gets it with
//! the charge and sends it back with its webhook) and fulfillment, and
//! `soldonce order show` prints it.

use serde_json::Value;
use soldonce_tests::eventually;
use soldonce_tests::system::{System, SystemOptions};
use std::time::Duration;

/// Every line of a service's log, each of which must be JSON.
fn json_lines(system: &System, service: &str) -> Vec<Value> {
    let path = system.dir().join(format!("{service}.log"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{service} logged a line that is not JSON ({e}): {l}"))
        })
        .collect()
}

/// A field of a JSON log line, from its fields or its span.
fn field<'a>(line: &'a Value, name: &str) -> Option<&'a str> {
    line["fields"][name]
        .as_str()
        .or_else(|| line["span"][name].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_orders_trace_id_runs_through_every_services_logs_and_the_psps_webhook() {
    let mut env = vec![];
    for service in ["psp-sim", "payment-worker", "fulfillment", "expiry"] {
        env.push((service, "RUST_LOG", "info".to_owned()));
    }
    // Placements and publishes are logged at debug: they are the hot paths.
    env.push(("checkout", "RUST_LOG", "info,checkout=debug".to_owned()));
    env.push((
        "outbox-relay",
        "RUST_LOG",
        "info,outbox_relay=debug".to_owned(),
    ));
    let system = System::start_with(SystemOptions {
        env,
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("TRACE-1", 1_990, 5).await;

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let request = system
        .app
        .client
        .post(format!("{}/v1/orders", system.url("checkout")))
        .bearer_auth(&system.app.token)
        .header("Idempotency-Key", "trace-order-1")
        .header("traceparent", &traceparent)
        .json(&serde_json::json!({"lines": [{"sku": "TRACE-1", "quantity": 1}]}));
    let placed = system.app.send(request).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let order_id = placed.body["id"].as_str().expect("order id").to_owned();

    // The order goes all the way: paid, shipped, delivered.
    eventually("the order delivered", Duration::from_secs(60), || async {
        let state: Option<(String,)> =
            sqlx::query_as("SELECT s.state FROM shipments s WHERE s.order_id = $1::uuid")
                .bind(&order_id)
                .fetch_optional(&system.app.pool)
                .await
                .ok()?;
        (state?.0 == "delivered").then_some(())
    })
    .await;

    // What each service said about this order, under its trace id.
    let expected: [(&str, &[&str]); 5] = [
        ("checkout", &["order placed", "webhook recorded"]),
        ("outbox-relay", &["event published"]),
        // Confirmed by the worker's answer, or already by the webhook.
        ("payment-worker", &["payment recorded"]),
        ("psp-sim", &["payment created", "webhook acknowledged"]),
        ("fulfillment", &["shipment created"]),
    ];
    for (service, messages) in expected {
        let lines = eventually(
            &format!("{service}'s lines about the order"),
            Duration::from_secs(20),
            || async {
                let about: Vec<Value> = json_lines(&system, service)
                    .into_iter()
                    .filter(|l| field(l, "order_id") == Some(order_id.as_str()))
                    .collect();
                messages
                    .iter()
                    .all(|m| {
                        about.iter().any(|l| {
                            l["fields"]["message"]
                                .as_str()
                                .is_some_and(|t| t.starts_with(m))
                        })
                    })
                    .then_some(about)
            },
        )
        .await;
        for line in &lines {
            assert_eq!(
                field(line, "trace_id"),
                Some(trace_id),
                "{service} logs the order under the buyer's trace id: {line}"
            );
        }
    }

    // The order's every event carries the trace, and `order show` prints it.
    let traces: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT metadata->>'traceparent' FROM events WHERE stream_id = $1::uuid")
            .bind(&order_id)
            .fetch_all(&system.app.pool)
            .await
            .expect("events");
    assert!(
        traces.len() >= 2,
        "placed and confirmed at least: {traces:?}"
    );
    for (tp,) in &traces {
        let tp = tp.as_deref().unwrap_or_default();
        assert_eq!(
            tp.get(3..35),
            Some(trace_id),
            "every event on the trace: {tp}"
        );
    }
    let (code, shown) = soldonce_tests::relay::soldonce(
        &["order", "show", &order_id],
        &[("DATABASE_URL", &system.app.database_url)],
    );
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains(trace_id),
        "order show prints the trace id: {shown}"
    );
}
