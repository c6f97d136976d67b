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
    psp_timeout: Duration,
    compensation_interval: Duration,
    reconcile_interval: Duration,
    capture_at: payments::psp::CaptureAt,
    relay: Option<tokio::sync::oneshot::Sender<()>>,
    /// The payment worker, fulfillment and expiry: stopped by [`Saga::stop_workers`].
    workers: Vec<tokio::sync::oneshot::Sender<()>>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// How a saga starts.
#[derive(Debug, Clone)]
pub struct SagaOptions {
    /// PSP faults, as JSON.
    pub faults: String,
    /// The payment worker's per-call PSP timeout.
    pub psp_timeout: Duration,
    /// How long reservations last.
    pub ttl: Duration,
    /// Whether the payment worker starts with the rest ([`Saga::start_worker`] starts it later).
    pub worker: bool,
    /// How often the worker looks for due compensations.
    pub compensation_interval: Duration,
    /// How often the worker reconciles with the PSP (zero: never; tests
    /// mostly reconcile explicitly, so each run is seen).
    pub reconcile_interval: Duration,
    /// When the worker's charges take the money (the product's default: at shipment).
    pub capture_at: payments::psp::CaptureAt,
}

impl Default for SagaOptions {
    fn default() -> Self {
        SagaOptions {
            faults: "{}".into(),
            psp_timeout: Duration::from_secs(2),
            ttl: Duration::from_secs(900),
            worker: true,
            compensation_interval: Duration::from_millis(100),
            reconcile_interval: Duration::ZERO,
            capture_at: payments::psp::CaptureAt::default(),
        }
    }
}

impl Saga {
    /// Starts the saga with these PSP faults (JSON) and a per-call PSP timeout.
    pub async fn start(faults: &str, psp_timeout: Duration) -> Saga {
        Saga::start_with(SagaOptions {
            faults: faults.into(),
            psp_timeout,
            ..SagaOptions::default()
        })
        .await
    }

    /// Like [`Saga::start`], with reservations that last `ttl`.
    pub async fn start_with_ttl(faults: &str, psp_timeout: Duration, ttl: Duration) -> Saga {
        Saga::start_with(SagaOptions {
            faults: faults.into(),
            psp_timeout,
            ttl,
            ..SagaOptions::default()
        })
        .await
    }

    /// Starts checkout, a relay, psp-sim and (unless told not to) a payment worker.
    pub async fn start_with(options: SagaOptions) -> Saga {
        let app = Arc::new(TestApp::spawn_with_ttl(options.ttl).await);
        let nats = Nats::start_temporary().expect("private nats");
        let relay = Some(crate::relay::spawn_in_process(&app.database_url, &nats.url()).await);
        let mut stops = vec![];

        let psp_settings = psp_sim::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            webhook: Some(psp_sim::WebhookTarget {
                url: app.url("/v1/psp/webhooks").parse().expect("url"),
                secret: psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret"),
            }),
            faults: psp_sim::Faults::from_json(&options.faults).expect("faults"),
            data_dir: None,
            public_url: None,
        };
        let (psp_url, stop) = spawn_psp_sim(psp_settings).await;
        stops.push(stop);
        let mut saga = Saga {
            app,
            nats,
            psp_url,
            psp_timeout: options.psp_timeout,
            compensation_interval: options.compensation_interval,
            reconcile_interval: options.reconcile_interval,
            capture_at: options.capture_at,
            relay,
            workers: vec![],
            stops,
        };
        if options.worker {
            saga.start_worker().await;
        }
        saga
    }

    /// Stops the relay (it finishes the batch in hand).
    pub fn stop_relay(&mut self) {
        if let Some(stop) = self.relay.take() {
            let _ = stop.send(());
        }
    }

    /// Starts a relay again after [`Saga::stop_relay`].
    pub async fn start_relay(&mut self) {
        self.stop_relay();
        self.relay =
            Some(crate::relay::spawn_in_process(&self.app.database_url, &self.nats.url()).await);
    }

    /// Whether a payment worker, fulfillment or expiry was started and not stopped.
    pub fn workers_running(&self) -> bool {
        !self.workers.is_empty()
    }

    /// Stops the payment worker, fulfillment and expiry (each finishes what it holds).
    pub fn stop_workers(&mut self) {
        for stop in self.workers.drain(..) {
            let _ = stop.send(());
        }
    }

    /// Starts a payment worker (it also carries out compensations).
    pub async fn start_worker(&mut self) {
        let worker_settings = payment_worker::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            database_url: self.app.database_url.clone(),
            nats_url: self.nats.url(),
            psp_url: self.psp_url.clone(),
            psp_timeout: self.psp_timeout,
            psp_deadline: Duration::from_secs(20),
            // Enough to start every test's charges at once.
            concurrency: 256,
            capture_concurrency: payment_worker::capture::DEFAULT_CONCURRENCY,
            batching: bus::consumer::Batching {
                // Batches of more than one, so every saga test runs batched.
                batch_size: 16,
                // Several, so transactions of the same consumer race; as many as
                // a debug build on a loaded machine needs to keep up with the
                // tests' bursts (2 let a burst's orders expire before they were
                // recorded).
                recorders: 8,
                // As by default: a buyer waits on it.
                linger: Duration::ZERO,
            },
            compensation_interval: self.compensation_interval,
            reconcile_interval: self.reconcile_interval,
            capture_at: self.capture_at,
            action_extension: Duration::from_secs(600),
            stream: bus::StreamSettings::default(),
        };
        let worker = payment_worker::Application::build(worker_settings)
            .await
            .expect("payment worker");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(worker.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        self.workers.push(stop);
    }

    /// Adds a fulfillment process with this warehouse step delay.
    pub async fn start_fulfillment(&mut self, step_delay: Duration) {
        let settings = fulfillment::Settings {
            addr: "127.0.0.1:0".parse().expect("addr"),
            database_url: self.app.database_url.clone(),
            nats_url: self.nats.url(),
            step_delay,
            batching: bus::consumer::Batching {
                batch_size: 16,
                recorders: 8,
                // As by default, so every saga test ships orders gathered by it.
                linger: fulfillment::LINGER,
            },
            stream: bus::StreamSettings::default(),
        };
        let app = fulfillment::Application::build(settings)
            .await
            .expect("build fulfillment");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        self.workers.push(stop);
    }

    /// Adds an expiry process.
    pub async fn start_expiry(&mut self, interval: Duration) {
        let stop = spawn_expiry(&self.app.database_url, interval).await;
        self.workers.push(stop);
    }

    /// Waits until nothing is in flight: no order pending, every confirmed
    /// order delivered and its payment captured, the outbox drained and
    /// every event in the stream.
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
                              + (SELECT count(*) FROM orders WHERE state = 'confirmed' AND capture IN ('authorized', 'decided')) \
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

    /// Replaces the PSP's faults (JSON), as an operator's `PUT /admin/faults` does.
    pub async fn set_faults(&self, faults: &str) {
        let body: serde_json::Value = serde_json::from_str(faults).expect("faults json");
        let r = self
            .app
            .send(
                self.app
                    .client
                    .put(format!("{}/admin/faults", self.psp_url))
                    .json(&body),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }

    /// Charges at the PSP directly, as a worker that then crashed would have;
    /// returns the payment.
    pub async fn charge_directly(
        &self,
        reference: &str,
        amount_minor: i64,
        currency: &str,
        key: &str,
    ) -> serde_json::Value {
        let body = serde_json::json!({ "amount_minor": amount_minor, "currency": currency, "reference": reference });
        let request = self
            .app
            .client
            .post(format!("{}/v1/payments", self.psp_url))
            .header("idempotency-key", key)
            .json(&body);
        let r = self.app.send(request).await;
        assert!(r.status == 201 || r.status == 200, "{}", r.body);
        r.body
    }

    /// One PSP payment by id.
    pub async fn psp_payment(&self, payment_id: &str) -> serde_json::Value {
        let r = self
            .app
            .send(
                self.app
                    .client
                    .get(format!("{}/v1/payments/{payment_id}", self.psp_url)),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    /// A PSP client like the payment worker's.
    pub fn psp_client(&self) -> payments::psp::Psp {
        payments::psp::Psp::new(
            &self.psp_url,
            Duration::from_secs(5),
            Duration::from_secs(20),
            8,
        )
        .expect("psp client")
    }

    /// One sample of psp-sim's `/metrics`, e.g.
    /// `psp_sim_webhook_attempts_total{result="acknowledged"}`; 0 if absent.
    pub async fn psp_metric(&self, sample: &str) -> f64 {
        crate::metric_sample(&psp_sim_metrics(&self.psp_url).await, sample).unwrap_or(0.0)
    }

    /// How many times psp-sim injected `fault` so far: its label in
    /// `psp_sim_faults_injected_total` (`fail_first`, `decline`,
    /// `lose_reply`, `drop_webhook`, `duplicate_webhook`,
    /// `reorder_webhooks`, `processing`, `action_required`).
    pub async fn faults_injected(&self, fault: &str) -> f64 {
        let text = psp_sim_metrics(&self.psp_url).await;
        let sample = format!("psp_sim_faults_injected_total{{fault=\"{fault}\"}}");
        crate::metric_sample(&text, &sample)
            .unwrap_or_else(|| panic!("psp-sim does not count {sample}:\n{text}"))
    }

    /// Waits until psp-sim has injected `fault` at least `times` times (a
    /// webhook's fault fires when the webhook goes out); returns the count.
    /// A test that injects a fault shows with it that the fault fired.
    pub async fn fault_fired(&self, fault: &str, times: f64) -> f64 {
        eventually(
            &format!("psp-sim to inject {fault} at least {times} times"),
            Duration::from_secs(30),
            || async {
                let n = self.faults_injected(fault).await;
                (n >= times).then_some(n)
            },
        )
        .await
    }

    /// Waits until the payment worker has nothing in hand or pending.
    pub async fn wait_worker_idle(&self, within: Duration) {
        let js = bus::connect(&self.nats.url()).await.expect("nats");
        eventually("the payment worker to be idle", within, || {
            let js = js.clone();
            async move {
                let mut c = js
                    .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>("payment-worker", bus::STREAM)
                    .await
                    .ok()?;
                c.info().await.is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0 && i.delivered.consumer_sequence > 0).then_some(())
            }
        })
        .await;
    }

    /// Every payment the PSP holds for an order.
    pub async fn psp_payments(&self, order_id: &str) -> Vec<serde_json::Value> {
        let r = self
            .app
            .send(
                self.app
                    .client
                    .get(format!("{}/v1/payments", self.psp_url))
                    .query(&[("reference", order_id)]),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        // Never an empty list by default: an answer without one fails.
        r.body["payments"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("psp-sim's answer holds no payments list: {}", r.body))
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
        let r = self.app.buy_retrying(sku, 1).await;
        assert_eq!(r.status, 202, "{}", r.body);
        r.body["id"].as_str().expect("id").to_owned()
    }
}

impl Drop for Saga {
    fn drop(&mut self) {
        self.stop_relay();
        self.stop_workers();
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Starts psp-sim in this process: its URL, and the sender that stops it.
pub async fn spawn_psp_sim(
    settings: psp_sim::Settings,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let psp = psp_sim::Application::build(settings)
        .await
        .expect("psp-sim");
    let psp_url = format!("http://{}", psp.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(psp.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    (psp_url, stop)
}

/// psp-sim's `/metrics` text, read over a connection of its own.
pub async fn psp_sim_metrics(psp_url: &str) -> String {
    reqwest::get(format!("{psp_url}/metrics"))
        .await
        .expect("psp-sim metrics")
        .text()
        .await
        .expect("psp-sim metrics body")
}

/// Every object of a psp-sim listing (`payments` or `refunds`), all pages.
pub async fn psp_listing(app: &TestApp, psp_url: &str, what: &str) -> Vec<serde_json::Value> {
    let mut all = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let mut request = app
            .client
            .get(format!("{psp_url}/v1/{what}"))
            .query(&[("limit", "100")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let page = app.send(request).await;
        assert_eq!(page.status, 200, "{}", page.body);
        all.extend(page.body["data"].as_array().expect("data").iter().cloned());
        match (
            page.body["has_more"].as_bool(),
            page.body["next_cursor"].as_str(),
        ) {
            (Some(true), Some(next)) => cursor = Some(next.to_owned()),
            _ => return all,
        }
    }
}

/// Starts an expiry process in-process; it stops when the sender is dropped.
pub async fn spawn_expiry(
    database_url: &str,
    interval: Duration,
) -> tokio::sync::oneshot::Sender<()> {
    let settings = expiry::Settings {
        addr: "127.0.0.1:0".parse().expect("addr"),
        database_url: database_url.to_owned(),
        interval,
        batch_size: 100,
        // Two release loops, as by default: the tests' batches are released concurrently.
        concurrency: 2,
        retention: Duration::from_secs(24 * 3600),
        audit_interval: Duration::ZERO,
        audit_full_every: Duration::from_secs(3600),
        audit_pace: 0.25,
    };
    let app = expiry::Application::build(settings)
        .await
        .expect("build expiry");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    stop
}

/// Delivers a PSP payment object (as the PSP's API shows it) in a freshly
/// signed `payment.succeeded` webhook with a new webhook id; returns the status.
pub async fn redeliver_payment_webhook(app: &TestApp, payment: &serde_json::Value) -> u16 {
    let now = chrono::Utc::now();
    let webhook_id = format!("msg_{}", Uuid::new_v4().simple());
    let body =
        serde_json::json!({ "type": "payment.succeeded", "timestamp": now, "data": payment })
            .to_string();
    let secret = psp_sim::signature::WebhookSecret::parse(WEBHOOK_SECRET).expect("secret");
    let signature =
        psp_sim::signature::sign(&secret, &webhook_id, now.timestamp(), body.as_bytes());
    let request = app
        .client
        .post(app.url("/v1/psp/webhooks"))
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", now.timestamp().to_string())
        .header("webhook-signature", signature)
        .body(body);
    app.send(request).await.status
}

/// Delivers a correctly signed `payment.succeeded` webhook for an order as
/// a PSP does: a `503` (its order was being decided by another writer) is
/// delivered again, for up to 10 s; returns the final status.
pub async fn pay_by_webhook(app: &TestApp, order_id: &str, amount_minor: i64) -> u16 {
    let payment = serde_json::json!({
        "id": format!("pay_{}", Uuid::new_v4().simple()), "status": "succeeded", "amount_minor": amount_minor,
        "currency": "BRL", "reference": order_id, "idempotency_key": format!("pay:{order_id}"),
        "failure_reason": null, "created_at": chrono::Utc::now(), "refunds": [] });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = redeliver_payment_webhook(app, &payment).await;
        if status != 503 || std::time::Instant::now() > deadline {
            return status;
        }
        // The PSP's own pause before a redelivery.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` orders of one unit of `sku` (priced `price_minor`), each bought,
/// paid by webhook and given its shipment in a transaction of its own, as
/// fulfillment does: each order's id with its new shipment's.
pub async fn shipped_orders(
    app: &TestApp,
    sku: &str,
    price_minor: i64,
    n: usize,
) -> Vec<(Uuid, Uuid)> {
    let mut shipped = Vec::with_capacity(n);
    for _ in 0..n {
        let id = app.buy(sku, 1).await.body["id"]
            .as_str()
            .expect("id")
            .to_owned();
        assert_eq!(pay_by_webhook(app, &id, price_minor).await, 200, "paid");
        let id: Uuid = id.parse().expect("uuid");
        let mut tx = app.pool.begin().await.expect("tx");
        let meta = events::Metadata::from_request("test", id, None);
        match store::shipments::create_many(&mut tx, &[(id, meta)])
            .await
            .expect("ship")[..]
        {
            [store::shipments::Created::New(shipment)] => shipped.push((id, shipment)),
            ref other => panic!("expected a new shipment, got {other:?}"),
        }
        tx.commit().await.expect("commit");
    }
    shipped
}

/// Runs the audit with these graces (seconds) for compensations and shipments.
pub async fn audit_with(
    app: &TestApp,
    compensation_grace: u64,
    shipment_grace: u64,
) -> store::audit::AuditReport {
    let options = store::audit::AuditOptions {
        compensation_grace: Duration::from_secs(compensation_grace),
        shipment_grace: Duration::from_secs(shipment_grace),
        ..store::audit::AuditOptions::default()
    };
    store::audit::run(&app.pool, &options)
        .await
        .expect("audit runs")
}

/// Runs the audit and panics naming every violation; the incremental
/// audit's checks, run over every order, must find the same.
pub async fn assert_audit_clean(app: &TestApp) {
    let options = store::audit::AuditOptions::default();
    let report = store::audit::run(&app.pool, &options)
        .await
        .expect("audit runs");
    assert!(report.clean(), "audit violations: {:#?}", report.violations);
    // Checked a few orders at a time, each group in a snapshot of its own.
    let chunked = store::audit::AuditOptions {
        chunk: 7,
        ..options
    };
    let delta = store::audit::incremental_from_scratch(&app.pool, &chunked)
        .await
        .expect("the incremental audit runs");
    assert!(
        delta.clean(),
        "the incremental audit's checks over every order: {:#?}",
        delta.violations
    );
    assert!(
        delta.orders >= report.orders && delta.skus >= report.skus,
        "both audits read every order ({} and {}) and SKU ({} and {})",
        report.orders,
        delta.orders,
        report.skus,
        delta.skus
    );
}
