//! The bus carries what `proto/events/` promises: one saga that goes down
//! every path publishes every event type there is a schema for, and each of
//! its messages validates against the envelope's schema and its type's.

use soldonce_tests::app::ADMIN_TOKEN;
use soldonce_tests::eventually;
use soldonce_tests::relay::{read_stream, stream_len};
use soldonce_tests::saga::{Saga, SagaOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

/// Every schema of `proto/events/` by the event type it is named for
/// (`order.placed.v1`), the envelope's as `envelope`.
fn schemas() -> BTreeMap<String, serde_json::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/events");
    let mut schemas = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("proto/events") {
        let path = entry.expect("a schema file").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(ty) = name.strip_suffix(".schema.json") else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("schema text");
        let schema = serde_json::from_str(&text).expect("schema JSON");
        schemas.insert(ty.to_owned(), schema);
    }
    schemas
}

/// Waits until the event store holds an event of type `ty` of `order` (or
/// of its shipment).
async fn wait_event(saga: &Saga, order: &str, ty: &str) {
    let sql = format!(
        "SELECT count(*) FROM events WHERE type = '{ty}' \
         AND (stream_id = '{order}'::uuid OR data->>'order_id' = '{order}')"
    );
    eventually(&format!("{ty} of {order}"), SETTLE, || async {
        (saga.app.count(&sql).await > 0).then_some(())
    })
    .await;
}

/// The one payment psp-sim holds for an order, once it is `succeeded`.
async fn taken(saga: &Saga, order: &str) -> String {
    eventually(&format!("{order}'s money taken"), SETTLE, || async {
        match &saga.psp_payments(order).await[..] {
            [p] if p["status"] == "succeeded" => p["id"].as_str().map(str::to_owned),
            _ => None,
        }
    })
    .await
}

/// POSTs `body` to psp-sim's `path`, as its dashboard or a bank would.
async fn at_psp(saga: &Saga, path: &str, body: serde_json::Value) {
    let request = saga
        .app
        .client
        .post(format!("{}{path}", saga.psp_url))
        .header("idempotency-key", format!("elsewhere-{path}"))
        .json(&body);
    let r = saga.app.send(request).await;
    assert!(r.status == 200 || r.status == 201, "{path}: {}", r.body);
}

/// Orders that end every way there is: expired, cancelled with a payment
/// landing after (refunded), declined, waiting on the buyer's 3-D Secure
/// step, cancelled by an operator before shipping (shipment stopped,
/// authorization voided), delivered and captured, then disputed or
/// refunded at the PSP's dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_type_is_published_and_validates_against_its_schema() {
    // No worker at first: an order nobody pays expires, and a cancelled
    // order's payment reaches soldonce only as the PSP's webhook.
    let mut saga = Saga::start_with(SagaOptions {
        ttl: Duration::from_secs(5),
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    saga.start_expiry(Duration::from_millis(50)).await;
    let app = saga.app.clone();
    app.add_product("MUG", 2500, 20).await;
    let expired = saga.order("MUG").await;
    let cancelled = saga.order("MUG").await;
    let r = app
        .post_empty(&app.token, &format!("/v1/orders/{cancelled}/cancel"))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    saga.charge_directly(&cancelled, 2500, "BRL", &format!("pay:{cancelled}"))
        .await;
    wait_event(&saga, &expired, "order.expired.v1").await;

    // The worker, and a warehouse that holds every shipment pending.
    saga.start_worker().await;
    saga.start_fulfillment(Duration::from_secs(3600)).await;
    saga.set_faults(r#"{"decline_rate": 1.0}"#).await;
    let declined = saga.order("MUG").await;
    assert_eq!(
        saga.settled_state(&declined, SETTLE).await,
        "payment_failed"
    );
    saga.set_faults(r#"{"action_required_rate": 1.0}"#).await;
    let challenged = saga.order("MUG").await;
    wait_event(&saga, &challenged, "order.action_required.v1").await;
    saga.set_faults("{}").await;
    let stopped = saga.order("MUG").await;
    let with_address = serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 2 }], "shipping": { "name": "Ana", "line1": "Rua A", "city": "Recife", "postal_code": "50000", "country": "BR" } });
    let delivered = app
        .place_retrying(&app.token, "with-an-address", &with_address)
        .await;
    assert_eq!(delivered.status, 202, "{}", delivered.body);
    let delivered = delivered.body["id"].as_str().expect("id").to_owned();
    let disputed = saga.order("MUG").await;
    for id in [&stopped, &delivered, &disputed] {
        assert_eq!(saga.settled_state(id, SETTLE).await, "confirmed");
        wait_event(&saga, id, "shipment.created.v1").await;
    }
    let request = app
        .client
        .post(app.url(&format!("/admin/v1/orders/{stopped}/cancel")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "reason": "address undeliverable" }));
    let r = app.send(request).await;
    assert_eq!(
        (r.status, r.body["outcome"].as_str()),
        (200, Some("cancelled")),
        "{}",
        r.body
    );

    // The warehouse speeds up: the others ship and their money is taken.
    saga.stop_workers();
    saga.start_worker().await;
    saga.start_fulfillment(Duration::from_millis(10)).await;
    for id in [&delivered, &disputed] {
        wait_event(&saga, id, "shipment.delivered.v1").await;
    }
    let refunded_elsewhere = taken(&saga, &delivered).await;
    let chargeback = taken(&saga, &disputed).await;
    // Recorded as captured before the PSP says anything more about the
    // money: a refund or dispute reported first leaves no capture to record.
    for id in [&delivered, &disputed] {
        wait_event(&saga, id, "order.captured.v1").await;
    }
    let refund = format!("/v1/payments/{refunded_elsewhere}/refunds");
    at_psp(&saga, &refund, serde_json::json!({ "amount_minor": 1000 })).await;
    let dispute = format!("/admin/payments/{chargeback}/dispute");
    at_psp(
        &saga,
        &dispute,
        serde_json::json!({ "reason": "fraudulent" }),
    )
    .await;
    for (id, ty) in [
        (&cancelled, "order.refunded.v1"),
        (&stopped, "order.operator_refunded.v1"),
        (&delivered, "order.refunded_elsewhere.v1"),
        (&disputed, "order.disputed.v1"),
    ] {
        wait_event(&saga, id, ty).await;
    }

    // Every event of the store on the stream, then each message checked.
    let js = bus::connect(&saga.nats.url()).await.expect("nats");
    eventually("every event on the stream", SETTLE, || async {
        let events = app.count("SELECT count(*) FROM events").await;
        (stream_len(&js).await == u64::try_from(events).unwrap_or(0)).then_some(())
    })
    .await;
    let schemas = schemas();
    let validator = |ty: &str| {
        let schema = schemas
            .get(ty)
            .unwrap_or_else(|| panic!("no schema in proto/events for {ty}"));
        jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("{ty}'s schema: {e}"))
    };
    let envelope = validator("envelope");
    let mut published = BTreeSet::new();
    for (id, (copies, payload)) in read_stream(&saga.nats.url()).await {
        assert_eq!(copies, 1, "event {id} on the stream {copies} times");
        let ty = payload["type"]
            .as_str()
            .expect("type")
            .trim_start_matches("soldonce.")
            .to_owned();
        for (what, checked) in [("envelope", &envelope), (ty.as_str(), &validator(&ty))] {
            let errors: Vec<String> = checked
                .iter_errors(&payload)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{ty} against {what}: {errors:?}\n{payload}"
            );
        }
        published.insert(ty);
    }
    let promised: BTreeSet<String> = schemas.into_keys().filter(|t| t != "envelope").collect();
    assert_eq!(
        published, promised,
        "the event types published, and those proto/events has"
    );
}
