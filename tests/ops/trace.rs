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

    // The order goes all the way: paid, shipped, delivered, its payment captured.
    eventually(
        "the order delivered and captured",
        Duration::from_secs(60),
        || async {
            let state: Option<(String, Option<String>)> = sqlx::query_as(
                "SELECT s.state, o.capture FROM shipments s JOIN orders o ON o.id = s.order_id WHERE s.order_id = $1::uuid",
            )
            .bind(&order_id)
            .fetch_optional(&system.app.pool)
            .await
            .ok()?;
            let (shipment, capture) = state?;
            (shipment == "delivered" && capture.as_deref() == Some("captured")).then_some(())
        },
    )
    .await;

    // What each service said about this order, under its trace id.
    let expected: [(&str, &[&str]); 5] = [
        ("checkout", &["order placed", "webhook recorded"]),
        ("outbox-relay", &["event published"]),
        // Confirmed by the worker's answer, or already by the webhook.
        // The capture too: asked of the PSP and recorded in the buyer's trace.
        ("payment-worker", &["payment recorded", "payment captured"]),
        (
            "psp-sim",
            &[
                "payment created",
                "payment captured",
                "webhook acknowledged",
            ],
        ),
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
        sqlx::query_as("SELECT traceparent FROM events WHERE stream_id = $1::uuid")
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

/// A span as an OTLP receiver got it: the exporting service, its ids and name.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    trace_state: String,
}

/// An OTLP/HTTP receiver on 127.0.0.1: decodes each `POST /v1/traces` body
/// with the official protobuf definitions (`opentelemetry-proto`) and keeps
/// every span.
async fn otlp_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Exported>>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use prost::Message;
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request = match ExportTraceServiceRequest::decode(body) {
                    Ok(r) => r,
                    Err(e) => return (axum::http::StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
                };
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                let mut got = kept.lock().expect("spans");
                for resource_spans in request.resource_spans {
                    let service = resource_spans
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| a.value.as_ref())
                        .and_then(|v| match &v.value {
                            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => Some(s.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                        got.push(Exported {
                            service: service.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_span_id: hex(&span.parent_span_id),
                            name: span.name,
                            kind: span.kind,
                            trace_state: span.trace_state,
                        });
                    }
                }
                (
                    axum::http::StatusCode::OK,
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the receiver");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_is_one_exported_trace_from_every_service_with_its_parent_links_intact() {
    let (endpoint, received) = otlp_receiver().await;
    let mut env = vec![];
    for service in [
        "checkout",
        "outbox-relay",
        "payment-worker",
        "fulfillment",
        "expiry",
        "psp-sim",
    ] {
        env.push((service, "OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()));
        // Batches leave every 100 ms, not every 5 s.
        env.push((service, "OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()));
    }
    let system = System::start_with(SystemOptions {
        env,
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("OTEL-1", 2_490, 5).await;

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let caller = "b7ad6b7169203331";
    let request = system
        .app
        .client
        .post(format!("{}/v1/orders", system.url("checkout")))
        .bearer_auth(&system.app.token)
        .header("Idempotency-Key", "otel-order-1")
        .header("traceparent", format!("00-{trace_id}-{caller}-01"))
        .header("tracestate", "shop=checkout-7,vendor=t61rcWkgMzE")
        .json(&serde_json::json!({"lines": [{"sku": "OTEL-1", "quantity": 1}]}));
    let placed = system.app.send(request).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let order_id = placed.body["id"].as_str().expect("order id").to_owned();
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

    // Every service's spans of the trace, each span's parent among them (the
    // root's parent is the caller's span).
    let wanted = [
        "checkout",
        "outbox-relay",
        "payment-worker",
        "psp-sim",
        "fulfillment",
    ];
    let spans = eventually(
        "spans from every service, each parent received",
        Duration::from_secs(30),
        || async {
            let all: Vec<Exported> = received
                .lock()
                .expect("spans")
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            let ids: std::collections::HashSet<&str> =
                all.iter().map(|s| s.span_id.as_str()).collect();
            let linked = all
                .iter()
                .all(|s| s.parent_span_id == caller || ids.contains(s.parent_span_id.as_str()));
            let everyone = wanted.iter().all(|w| all.iter().any(|s| s.service == *w));
            (linked && everyone).then_some(all)
        },
    )
    .await;
    let by_id: std::collections::HashMap<&str, &Exported> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let parent_of = |s: &Exported| by_id.get(s.parent_span_id.as_str()).copied();
    // One root: checkout's server span of the placement, under the caller's span.
    let roots: Vec<&Exported> = spans
        .iter()
        .filter(|s| s.parent_span_id == caller)
        .collect();
    assert_eq!(roots.len(), 1, "one span continues the caller's: {roots:?}");
    assert_eq!(
        (
            roots[0].service.as_str(),
            roots[0].name.as_str(),
            roots[0].kind
        ),
        ("checkout", "POST /v1/orders", 2),
        "the root is checkout's server span: {:?}",
        roots[0]
    );
    // The chain an order walks: checkout → relay → payment-worker → psp-sim
    // → its webhook → checkout, and relay → fulfillment.
    let hop = |service: &str, parent_service: &str| {
        spans.iter().any(|s| {
            s.service == service && parent_of(s).is_some_and(|p| p.service == parent_service)
        })
    };
    for (child, parent) in [
        ("outbox-relay", "checkout"),
        ("payment-worker", "outbox-relay"),
        ("psp-sim", "payment-worker"),
        ("checkout", "psp-sim"),
        ("fulfillment", "outbox-relay"),
    ] {
        assert!(
            hop(child, parent),
            "a {child} span whose parent is a {parent} span: {spans:#?}"
        );
    }
    // The caller's tracestate travelled with the trace through every hop.
    for span in &spans {
        assert_eq!(
            span.trace_state, "shop=checkout-7,vendor=t61rcWkgMzE",
            "every span carries the caller's tracestate: {span:?}"
        );
    }
    // Counted a second way: the events' stored traceparents name spans that were exported.
    let stored: Vec<(String,)> = sqlx::query_as(
        "SELECT traceparent FROM events WHERE stream_id = $1::uuid AND traceparent IS NOT NULL",
    )
    .bind(&order_id)
    .fetch_all(&system.app.pool)
    .await
    .expect("events");
    assert!(
        stored.len() >= 2,
        "placed and confirmed at least: {stored:?}"
    );
    for (tp,) in &stored {
        let span = tp.get(36..52).unwrap_or_default();
        assert!(
            by_id.contains_key(span),
            "the event's traceparent {tp} names an exported span"
        );
    }
}

#[test]
fn an_otlp_setting_soldonce_cannot_honour_is_one_line_naming_it_and_exit_2() {
    for (name, value, says) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "http/protobuf"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "collector:4318",
            "not an http",
        ),
        ("OTEL_TRACES_EXPORTER", "zipkin", "only otlp"),
    ] {
        let out = std::process::Command::new(soldonce_tests::relay::binary("checkout"))
            .env_clear()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
            .env(name, value)
            .output()
            .expect("checkout runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}={value}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].contains(name) && lines[0].contains(says),
            "{name}={value}: {stderr}"
        );
    }
}

/// A collector that accepts connections and never answers.
async fn black_hole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_delays_no_order_and_no_stop() {
    let endpoint = black_hole().await;
    let mut env = vec![];
    for service in [
        "checkout",
        "outbox-relay",
        "payment-worker",
        "fulfillment",
        "expiry",
        "psp-sim",
    ] {
        env.push((service, "OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()));
        env.push((service, "OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()));
    }
    let mut system = System::start_with(SystemOptions {
        env,
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("HOLE-1", 990, 20).await;
    let mut ids = vec![];
    for i in 0..10 {
        let request = system
            .app
            .client
            .post(format!("{}/v1/orders", system.url("checkout")))
            .bearer_auth(&system.app.token)
            .header("Idempotency-Key", format!("hole-{i}"))
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .json(&serde_json::json!({"lines": [{"sku": "HOLE-1", "quantity": 1}]}));
        let placed = system.app.send(request).await;
        assert_eq!(placed.status, 202, "{}", placed.body);
        ids.push(placed.body["id"].as_str().expect("id").to_owned());
    }
    // Every order ends as without tracing: paid, shipped, delivered.
    eventually(
        "the ten orders delivered",
        Duration::from_secs(60),
        || async {
            let delivered: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM shipments WHERE state = 'delivered' AND order_id::text = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&system.app.pool)
        .await
        .ok()?;
            (delivered == 10).then_some(())
        },
    )
    .await;
    let sold: i64 = sqlx::query_scalar("SELECT sold FROM stock_sold WHERE sku = 'HOLE-1'")
        .fetch_one(&system.app.pool)
        .await
        .expect("stock");
    assert_eq!(sold, 10, "counted a second way: ten units sold");
    // Stopping waits for the collector at most its flush bound, then exits cleanly.
    for service in ["checkout", "payment-worker"] {
        let started = std::time::Instant::now();
        let code = system.terminate(service).await;
        assert_eq!(code, Some(0), "{service} exits cleanly");
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{service} stopped in {:?} with a collector that never answers",
            started.elapsed()
        );
    }
}
