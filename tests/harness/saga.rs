//! The whole payment leg: checkout, a relay, a payment worker and psp-sim
//! (sending signed webhooks to checkout), over a private NATS server.

use crate::app::{TestApp, WEBHOOK_SECRET};
use crate::eventually;
use localservers::Nats;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Everything a payment needs, running.
pub struct Saga {
    pub app: Arc<TestApp>,
    pub nats: Nats,
    pub psp_url: String,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Saga {
    /// Starts the saga with these PSP faults (JSON) and a per-call PSP timeout.
    pub async fn start(faults: &str, psp_timeout: Duration) -> Saga {
        Saga::start_with_ttl(faults, psp_timeout, Duration::from_secs(900)).await
    }

    /// Like [`Saga::start`], with reservations that last `ttl`.
    pub async fn start_with_ttl(faults: &str, psp_timeout: Duration, ttl: Duration) -> Saga {
        let app = Arc::new(TestApp::spawn_with_ttl(ttl).await);
        let nats = Nats::start_temporary().expect("private nats");
        let mut stops = vec![crate::relay::spawn_in_process(&app.database_url, &nats.url()).await];

        let psp_settings = psp_sim::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            webhook: Some(psp_sim::WebhookTarget {
                url: app.url("/v1/psp/webhooks").parse().expect("url"),
                secret: psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret"),
            }),
            faults: psp_sim::Faults::from_json(faults).expect("faults"),
        };
        let psp = psp_sim::Application::build(psp_settings).await.expect("psp-sim");
        let psp_url = format!("http://{}", psp.local_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(psp.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        stops.push(stop);

        let worker_settings = payment_worker::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            database_url: app.database_url.clone(),
            nats_url: nats.url(),
            psp_url: psp_url.clone(),
            psp_timeout,
            psp_deadline: Duration::from_secs(20),
            // Enough to start every test's charges at once.
            concurrency: 256,
            stream: bus::StreamSettings::default(),
        };
        let worker = payment_worker::Application::build(worker_settings).await.expect("payment worker");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(worker.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        stops.push(stop);
        Saga { app, nats, psp_url, stops }
    }

    /// Adds a fulfillment process with this warehouse step delay.
    pub async fn start_fulfillment(&mut self, step_delay: Duration) {
        let settings = fulfillment::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            database_url: self.app.database_url.clone(),
            nats_url: self.nats.url(),
            step_delay,
            stream: bus::StreamSettings::default(),
        };
        let app = fulfillment::Application::build(settings).await.expect("build fulfillment");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        self.stops.push(stop);
    }

    /// Adds an expiry process.
    pub async fn start_expiry(&mut self, interval: Duration) {
        let stop = spawn_expiry(&self.app.database_url, interval).await;
        self.stops.push(stop);
    }

    /// Waits until nothing is in flight: no order pending, every confirmed
    /// order delivered, the outbox drained and every event in the stream.
    pub async fn wait_quiescent(&self, within: Duration) {
        let js = bus::connect(&self.nats.url()).await.expect("nats");
        eventually("the saga to come to rest", within, || {
            let js = js.clone();
            async move {
                let app = &self.app;
                let busy = app
                    .count(
                        "SELECT (SELECT count(*) FROM orders WHERE state = 'payment_pending') \
                              + (SELECT count(*) FROM orders o LEFT JOIN shipments s ON s.order_id = o.id \
                                 WHERE o.state = 'confirmed' AND (s.state IS NULL OR s.state <> 'delivered')) \
                              + (SELECT count(*) FROM outbox)",
                    )
                    .await;
                let events = app.count("SELECT count(*) FROM events").await;
                // A late payment may be in flight for an order that is no longer pending.
                let mut idle = true;
                for consumer in ["payment-worker", "fulfillment"] {
                    if let Ok(mut c) = js.get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(consumer, bus::STREAM).await {
                        idle &= c.info().await.is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0);
                    }
                }
                (idle && busy == 0 && crate::relay::stream_len(&js).await == u64::try_from(events).unwrap_or(0)).then_some(())
            }
        })
        .await;
    }

    /// Every payment the PSP holds for an order.
    pub async fn psp_payments(&self, order_id: &str) -> Vec<serde_json::Value> {
        let r = self.app.send(self.app.client.get(format!("{}/v1/payments", self.psp_url)).query(&[("reference", order_id)])).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["payments"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until the order leaves `payment_pending`; returns its state.
    pub async fn settled_state(&self, order_id: &str, within: Duration) -> String {
        let path = format!("/v1/orders/{order_id}");
        eventually(&format!("order {order_id} to settle"), within, || async {
            let r = self.app.get(&self.app.token, &path).await;
            let state = r.body["state"].as_str().unwrap_or("").to_owned();
            (state != "payment_pending" && !state.is_empty()).then_some(state)
        })
        .await
    }

    /// Places an order for one unit of `sku`, retrying a 503 with the same
    /// key as a client should; returns its id.
    pub async fn order(&self, sku: &str) -> String {
        let key = Uuid::new_v4().to_string();
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": 1 }] });
        let r = eventually("checkout to accept the order", Duration::from_secs(60), || async {
            let r = self.app.place(&self.app.token, &key, &body).await;
            (r.status != 503).then_some(r)
        })
        .await;
        assert_eq!(r.status, 202, "{}", r.body);
        r.body["id"].as_str().expect("id").to_owned()
    }
}

impl Drop for Saga {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Starts an expiry process in-process; it stops when the sender is dropped.
pub async fn spawn_expiry(database_url: &str, interval: Duration) -> tokio::sync::oneshot::Sender<()> {
    let settings = expiry::Settings {
        addr: "127.0.0.1:0".parse().expect("addr"),
        database_url: database_url.to_owned(),
        interval,
        batch_size: 100,
        retention: Duration::from_secs(24 * 3600),
        audit_interval: Duration::ZERO,
    };
    let app = expiry::Application::build(settings).await.expect("build expiry");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    stop
}

/// Delivers a correctly signed `payment.succeeded` webhook for an order; returns the status.
pub async fn pay_by_webhook(app: &TestApp, order_id: &str, amount_minor: i64) -> u16 {
    let now = chrono::Utc::now();
    let webhook_id = format!("msg_{}", Uuid::new_v4().simple());
    let body = serde_json::json!({ "type": "payment.succeeded", "timestamp": now, "data": {
        "id": format!("pay_{}", Uuid::new_v4().simple()), "status": "succeeded", "amount_minor": amount_minor,
        "currency": "BRL", "reference": order_id, "idempotency_key": format!("pay:{order_id}"),
        "failure_reason": null, "created_at": now, "refunds": [] } })
    .to_string();
    let secret = psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret");
    let signature = psp_sim::signature::sign(&secret, &webhook_id, now.timestamp(), body.as_bytes());
    let request = app
        .client
        .post(app.url("/v1/psp/webhooks"))
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", now.timestamp().to_string())
        .header("webhook-signature", signature)
        .body(body);
    app.send(request).await.status
}

/// Runs the audit and panics naming every violation.
pub async fn assert_audit_clean(app: &TestApp) {
    let report = store::audit::run(&app.pool, 300.0).await.expect("audit runs");
    assert!(report.clean(), "audit violations: {:#?}", report.violations);
}
