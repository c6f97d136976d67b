//! The test harness: a `TestApp` with typed helpers, a recording webhook receiver, and polling
//! with a deadline instead of sleeps.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use psp_sim::model::{Payment, PaymentStatus};
use psp_sim::problem::Problem;
use psp_sim::signature::WebhookSecret;
use psp_sim::webhook::WebhookPayload;
use psp_sim::{Application, Faults, Settings, WebhookTarget};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long `eventually` waits before failing the test.
const DEADLINE: Duration = Duration::from_secs(10);

fn init_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("psp_sim=debug,info")
                .with_test_writer()
                .try_init();
        }
    });
}

/// The secret shared by the simulator and the test receiver, in `whsec_` form.
pub fn secret_text() -> String {
    let key = base64::engine::general_purpose::STANDARD.encode(b"psp-sim test signing key 0123456");
    format!("whsec_{key}")
}

pub fn secret() -> WebhookSecret {
    WebhookSecret::parse(&secret_text()).unwrap()
}

/// A simulator running in this process.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Faults::default(), None).await
    }

    pub async fn spawn_with(faults: Faults, receiver: Option<&Receiver>) -> Self {
        let settings = Settings {
            addr: "127.0.0.1:0".parse().unwrap(),
            webhook: receiver.map(|r| WebhookTarget {
                url: r.url.parse().unwrap(),
                secret: secret(),
            }),
            faults,
            data_dir: None,
            public_url: None,
        };
        let (addr, app) = Self::build(settings).await;
        tokio::spawn(app.run_until_stopped(std::future::pending()));
        Self {
            addr,
            client: reqwest::Client::new(),
        }
    }

    /// A built but not yet running application, for tests that control shutdown.
    pub async fn build(settings: Settings) -> (SocketAddr, Application) {
        init_logs();
        let app = Application::build(settings).await.unwrap();
        (app.local_addr(), app)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn pay(&self, key: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/payments"))
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn refund(
        &self,
        payment_id: &str,
        key: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let request = self
            .client
            .post(self.url(&format!("/v1/payments/{payment_id}/refunds")))
            .header("Idempotency-Key", key);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send().await.unwrap()
    }

    /// Every payment for a reference, as the PSP reports it.
    pub async fn payments_for(&self, reference: &str) -> Vec<Payment> {
        let response = self
            .client
            .get(self.url("/v1/payments"))
            .query(&[("reference", reference)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let list: Value = response.json().await.unwrap();
        serde_json::from_value(list["payments"].clone()).unwrap()
    }

    /// The payment made with this key, if any.
    pub async fn payment_by_key(&self, key: &str) -> Option<Payment> {
        let response = self
            .client
            .get(self.url("/v1/payments"))
            .query(&[("idempotency_key", key)])
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            200 => Some(response.json().await.unwrap()),
            404 => None,
            other => panic!("unexpected status {other}"),
        }
    }

    /// One page of a listing (`/v1/payments` or `/v1/refunds`), which must answer 200.
    pub async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Listing<T> {
        let response = self
            .client
            .get(self.url(path))
            .query(query)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// Every page of a listing, following `next_cursor` while `has_more`.
    pub async fn list_all<T: DeserializeOwned>(&self, path: &str, limit: usize) -> Vec<Listing<T>> {
        let limit = limit.to_string();
        let mut pages: Vec<Listing<T>> = Vec::new();
        loop {
            let mut query = vec![("limit", limit.as_str())];
            if let Some(cursor) = pages.last().and_then(|page| page.next_cursor.as_deref()) {
                query.push(("cursor", cursor));
            }
            let page = self.list(path, &query).await;
            let more = page.has_more;
            pages.push(page);
            if !more {
                return pages;
            }
        }
    }

    pub async fn put_faults(&self, faults: &Value) -> reqwest::Response {
        self.client
            .put(self.url("/admin/faults"))
            .json(faults)
            .send()
            .await
            .unwrap()
    }

    /// The value of one sample line of `/metrics`, e.g. `psp_sim_refunds_total`.
    pub async fn metric(&self, sample: &str) -> u64 {
        let text = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
            .parse()
            .unwrap()
    }
}

/// A listing page: `{"data", "has_more", "next_cursor"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Settings for an in-process simulator on port 0 keeping its books in `dir`.
pub fn settings_in(dir: &Path, faults: Faults) -> Settings {
    Settings {
        addr: "127.0.0.1:0".parse().unwrap(),
        faults,
        data_dir: Some(dir.to_path_buf()),
        ..Settings::default()
    }
}

/// A simulator running in this process until the test stops it.
pub struct Running {
    pub app: TestApp,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

impl Running {
    pub async fn start(settings: Settings) -> Self {
        let (addr, app) = TestApp::build(settings).await;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        let app = TestApp {
            addr,
            client: reqwest::Client::new(),
        };
        Self { app, stop, server }
    }

    /// Stops the simulator and waits until it has.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

pub fn payment_body(amount_minor: i64, reference: &str) -> Value {
    serde_json::json!({ "amount_minor": amount_minor, "currency": "BRL", "reference": reference })
}

/// Reads a problem+json error, checking its status and media type.
pub async fn problem(response: reqwest::Response, status: u16) -> Problem {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Problem = response.json().await.unwrap();
    assert_eq!(problem.status, status);
    problem
}

/// Polls `probe` until it yields a value, failing the test after the deadline.
pub async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One request the receiver saw, and what it answered.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub answered: StatusCode,
}

impl Delivery {
    pub fn header(&self, name: &str) -> &str {
        self.headers[name].to_str().unwrap()
    }

    pub fn payload(&self) -> WebhookPayload<Value> {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct ReceiverState {
    deliveries: Mutex<Vec<Delivery>>,
    failures_left: AtomicU32,
}

/// A webhook receiver on port 0 that records every request and answers 500 to the first few.
pub struct Receiver {
    pub url: String,
    state: Arc<ReceiverState>,
}

impl Receiver {
    pub async fn start(fail_first: u32) -> Self {
        let state = Arc::new(ReceiverState {
            failures_left: AtomicU32::new(fail_first),
            ..ReceiverState::default()
        });
        let router = axum::Router::new()
            .fallback(record)
            .with_state(Arc::clone(&state));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self { url, state }
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state.deliveries.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests have arrived, and returns them all.
    pub async fn wait_for(&self, count: usize) -> Vec<Delivery> {
        eventually(&format!("{count} webhook deliveries"), async || {
            let deliveries = self.deliveries();
            (deliveries.len() >= count).then_some(deliveries)
        })
        .await
    }
}

async fn record(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let fail = state
        .failures_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    let answered = if fail {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    };
    state.deliveries.lock().unwrap().push(Delivery {
        headers,
        body,
        answered,
    });
    answered
}

/// Polls the payment made with `key` until it is no longer processing.
pub async fn settled(app: &TestApp, key: &str) -> Payment {
    eventually("the payment to settle", async || {
        let payment = app.payment_by_key(key).await?;
        (payment.status != PaymentStatus::Processing).then_some(payment)
    })
    .await
}
