//! The payment provider client. One stable key per action (`pay:<order_id>`,
//! `refund:<payment_id>`, `capture:<payment_id>`, `void:<payment_id>`); only what is retryable is
//! retried (connect error, timeout, 5xx, 429), with jittered exponential
//! backoff under a total deadline. A timeout is an unknown outcome, resolved
//! by asking the provider by key — never by charging with a new key.

use backon::{ExponentialBuilder, Retryable};
use platform::otel::{Hop, Kind};
use serde::Deserialize;
use std::time::Duration;
use uuid::Uuid;

mod replies;
pub use replies::{NextAction, PaymentPage, PspDispute, PspPayment, PspRefund};

/// Why a call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum PspError {
    /// Worth retrying: connect error, timeout, 5xx, 429.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The provider refused the request itself (4xx): retrying cannot help.
    #[error("refused: {0}")]
    Refused(String),
    /// A refund asked for more than is left: the payment was refunded
    /// already, by this key's earlier refund or elsewhere (RFC 9457 type
    /// `…:refund-exceeds-remaining`). Not retryable; the caller looks.
    #[error("nothing left to refund: {0}")]
    NothingLeft(String),
    /// The payment is not in a state the action applies to (a capture of
    /// one captured or canceled already, a void of one captured: types
    /// `…:payment-not-capturable`, `…:payment-not-cancelable`). Not
    /// retryable; the caller looks at the payment.
    #[error("not in a state for this: {0}")]
    WrongState(String),
}

impl PspError {
    fn retryable(&self) -> bool {
        matches!(self, PspError::Retryable(_))
    }
}

/// When an order's money is taken (`CAPTURE_AT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CaptureAt {
    /// Authorize at checkout, capture when the order ships: a cancel or a
    /// payment that cannot settle its order before then is a void.
    #[default]
    Shipment,
    /// Take the money as the payment succeeds.
    Confirmation,
}

impl std::fmt::Display for CaptureAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureAt::Shipment => "shipment",
            CaptureAt::Confirmation => "confirmation",
        })
    }
}

impl std::str::FromStr for CaptureAt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shipment" => Ok(CaptureAt::Shipment),
            "confirmation" => Ok(CaptureAt::Confirmation),
            other => Err(format!("must be shipment or confirmation, not {other:?}")),
        }
    }
}

/// A client for one provider.
#[derive(Clone)]
pub struct Psp {
    http: reqwest::Client,
    base: String,
    deadline: Duration,
    capture_at: CaptureAt,
}

impl Psp {
    /// A client with a per-call `timeout` and a total `deadline` per action,
    /// keeping up to `connections` idle connections to the provider open
    /// between calls: as many as calls run at once, so that a busy worker
    /// reuses its connections instead of opening one per call.
    pub fn new(
        base: &str,
        timeout: Duration,
        deadline: Duration,
        connections: usize,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(connections)
            .build()?;
        Ok(Psp {
            http,
            base: base.trim_end_matches('/').to_owned(),
            deadline,
            capture_at: CaptureAt::default(),
        })
    }

    /// The same client, making charges that capture at `capture_at`.
    pub fn capturing_at(self, capture_at: CaptureAt) -> Self {
        Psp { capture_at, ..self }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(usize::MAX)
            .with_total_delay(Some(self.deadline))
    }

    /// Charges the order, or learns the outcome of an earlier charge with
    /// the same key. `traceparent` (the order's trace) goes with the call, so
    /// the PSP's logs and webhooks carry the order's trace id.
    pub async fn pay(
        &self,
        order_id: Uuid,
        amount_minor: i64,
        currency: &str,
        trace: Option<(&str, Option<&str>)>,
    ) -> Result<PspPayment, PspError> {
        let key = format!("pay:{order_id}");
        let capture_method = match self.capture_at {
            CaptureAt::Shipment => "manual",
            CaptureAt::Confirmation => "automatic",
        };
        let body = serde_json::json!({ "amount_minor": amount_minor, "currency": currency, "reference": order_id.to_string(), "capture_method": capture_method });
        (|| async {
            match self
                .post(&format!("{}/v1/payments", self.base), &key, &body, trace)
                .await
            {
                Err(PspError::Retryable(why)) => {
                    metrics::counter!("soldonce_psp_retries_total", "action" => "pay").increment(1);
                    // The charge may have happened: ask by key before trying again.
                    match self.find_by_key(&key).await {
                        Ok(Some(found)) => {
                            metrics::counter!("soldonce_psp_unknown_resolved_total").increment(1);
                            Ok(found)
                        }
                        _ => Err(PspError::Retryable(why)),
                    }
                }
                other => other,
            }
        })
        .retry(self.backoff())
        .when(PspError::retryable)
        .await
    }

    /// Asks once for a full refund of a payment with a stable `key`; the
    /// caller owns retrying (a compensation is retried across restarts).
    pub async fn refund_once(&self, payment_id: &str, key: &str) -> Result<PspRefund, PspError> {
        self.refund_part_once(payment_id, key, None).await
    }

    /// Asks once for a refund of `amount_minor` (everything left when
    /// `None`) of a payment with a stable `key`; the caller owns retrying.
    pub async fn refund_part_once(
        &self,
        payment_id: &str,
        key: &str,
        amount_minor: Option<i64>,
    ) -> Result<PspRefund, PspError> {
        let url = format!("{}/v1/payments/{payment_id}/refunds", self.base);
        let body = match amount_minor {
            Some(amount) => serde_json::json!({ "amount_minor": amount }),
            None => serde_json::json!({}),
        };
        self.post(&url, key, &body, None).await
    }

    /// Asks once to capture an authorized payment with a stable `key`
    /// (`amount_minor`: all of it when `None`); the caller owns retrying.
    pub async fn capture_once(
        &self,
        payment_id: &str,
        key: &str,
        amount_minor: Option<i64>,
        trace: Option<(&str, Option<&str>)>,
    ) -> Result<PspPayment, PspError> {
        let url = format!("{}/v1/payments/{payment_id}/capture", self.base);
        let body = match amount_minor {
            Some(amount) => serde_json::json!({ "amount_minor": amount }),
            None => serde_json::json!({}),
        };
        self.post(&url, key, &body, trace).await
    }

    /// Asks once to void (cancel) an uncaptured authorization with a stable
    /// `key`; the caller owns retrying.
    pub async fn cancel_once(&self, payment_id: &str, key: &str) -> Result<PspPayment, PspError> {
        let url = format!("{}/v1/payments/{payment_id}/cancel", self.base);
        self.post(&url, key, &serde_json::json!({}), None).await
    }

    /// The payment with this id, if the provider holds it.
    pub async fn payment(&self, payment_id: &str) -> Result<Option<PspPayment>, PspError> {
        get_optional(
            self.http
                .get(format!("{}/v1/payments/{payment_id}", self.base)),
        )
        .await
    }

    /// One page of payments created at or after `since`, oldest first.
    pub async fn list_payments(
        &self,
        since: Option<chrono::DateTime<chrono::Utc>>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<PaymentPage, PspError> {
        let mut query = vec![("limit", limit.to_string())];
        if let Some(since) = since {
            query.push((
                "created_gte",
                since.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ));
        }
        if let Some(cursor) = cursor {
            query.push(("cursor", cursor.to_owned()));
        }
        let response = self
            .http
            .get(format!("{}/v1/payments", self.base))
            .query(&query)
            .send()
            .await
            .map_err(|e| PspError::Retryable(e.to_string()))?;
        match response.status().as_u16() {
            200 => response
                .json()
                .await
                .map_err(|e| PspError::Retryable(format!("unreadable listing: {e}"))),
            _ => Err(classify(response).await),
        }
    }

    /// The payment made with `key`, if any.
    pub async fn find_by_key(&self, key: &str) -> Result<Option<PspPayment>, PspError> {
        get_optional(
            self.http
                .get(format!("{}/v1/payments", self.base))
                .query(&[("idempotency_key", key)]),
        )
        .await
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        key: &str,
        body: &serde_json::Value,
        trace: Option<(&str, Option<&str>)>,
    ) -> Result<T, PspError> {
        let started = std::time::Instant::now();
        let mut request = self
            .http
            .post(url)
            .header("idempotency-key", key)
            .json(body);
        // Each attempt is a client span of the caller's trace; the PSP continues it.
        let mut hop = trace
            .and_then(|(t, state)| Some((platform::trace::TraceParent::parse(t)?, state)))
            .map(|(parent, state)| {
                let mut hop = Hop::start(Kind::Client, "POST", Some(parent))
                    .with_tracestate(state.map(str::to_owned));
                hop.attribute("http.request.method", "POST");
                hop.attribute("url.full", url.to_owned());
                hop
            });
        if let Some(hop) = &hop {
            request = request.header("traceparent", hop.traceparent().to_string());
            if let Some(state) = hop.tracestate() {
                request = request.header("tracestate", state);
            }
        }
        let sent = request.send().await;
        if let Some(hop) = hop.as_mut() {
            match &sent {
                Ok(r) => {
                    hop.attribute("http.response.status_code", i64::from(r.status().as_u16()));
                    if !r.status().is_success() {
                        hop.fail(r.status());
                    }
                }
                Err(e) => hop.fail(e),
            }
        }
        drop(hop);
        metrics::histogram!("soldonce_psp_latency_seconds").record(started.elapsed().as_secs_f64());
        let response = sent.map_err(|e| {
            if e.is_timeout() {
                metrics::counter!("soldonce_psp_timeouts_total").increment(1);
            }
            PspError::Retryable(e.to_string())
        })?;
        if !response.status().is_success() {
            return Err(classify(response).await);
        }
        response
            .json()
            .await
            .map_err(|e| PspError::Retryable(format!("unreadable reply: {e}")))
    }
}

/// Sorts a failed answer by status and, for a `409`, by its RFC 9457
/// problem `type`: only a payment still processing is worth asking again;
/// any other conflict is an answer that retrying cannot change.
async fn classify(response: reqwest::Response) -> PspError {
    let status = response.status().as_u16();
    if status == 429 || status >= 500 {
        return PspError::Retryable(format!("HTTP {status}"));
    }
    let problem: Problem = response.json().await.unwrap_or_default();
    let detail = format!("HTTP {status} {}: {}", problem.kind, problem.detail);
    match (status, problem.kind.rsplit(':').next().unwrap_or("")) {
        (409, "payment-processing") => PspError::Retryable(detail),
        (409, "refund-exceeds-remaining") => PspError::NothingLeft(detail),
        (409, "payment-not-capturable" | "payment-not-cancelable") => PspError::WrongState(detail),
        _ => PspError::Refused(detail),
    }
}

/// The parts of an RFC 9457 problem body soldonce reads.
#[derive(Debug, Default, Deserialize)]
struct Problem {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    detail: String,
}

/// A GET whose `404` means "none": the body on `200`, else the error.
async fn get_optional<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<Option<T>, PspError> {
    let response = request
        .send()
        .await
        .map_err(|e| PspError::Retryable(e.to_string()))?;
    match response.status().as_u16() {
        404 => Ok(None),
        200 => response
            .json()
            .await
            .map(Some)
            .map_err(|e| PspError::Retryable(e.to_string())),
        _ => Err(classify(response).await),
    }
}

/// What a void came to.
#[derive(Debug)]
pub enum Void {
    /// The authorization is canceled at the PSP: by this void, or before it
    /// (lapsed, abandoned, voided at the dashboard).
    Voided(Box<PspPayment>),
    /// No answer yet: ask again later.
    Retry(String),
    /// It cannot be voided (captured meanwhile, gone, refused): a person must look.
    NeedsPerson(String),
}

impl Psp {
    /// Voids the uncaptured authorization `payment_id` with `key`, once;
    /// when the PSP says it cannot (its state), looks at the payment to
    /// tell a void already in effect from a capture that beat it.
    pub async fn void(&self, payment_id: &str, key: &str) -> Void {
        let payment = match self.cancel_once(payment_id, key).await {
            Ok(payment) => payment,
            Err(PspError::WrongState(why)) => match self.payment(payment_id).await {
                Ok(Some(payment)) => payment,
                Ok(None) => {
                    return Void::NeedsPerson(format!("{why}; the PSP no longer holds the payment"))
                }
                Err(e) => return Void::Retry(format!("{why}; looking it up: {e}")),
            },
            Err(PspError::Retryable(why)) => return Void::Retry(why),
            Err(e) => return Void::NeedsPerson(format!("the PSP refused the void: {e}")),
        };
        match payment.status.as_str() {
            "canceled" => Void::Voided(Box::new(payment)),
            "succeeded" => Void::NeedsPerson(format!(
                "the authorization was captured ({} taken) before its void: the buyer is owed a refund a person must decide",
                payment.amount_captured.unwrap_or(payment.amount_minor)
            )),
            other => Void::Retry(format!("payment {} is {other}", payment.id)),
        }
    }
}
