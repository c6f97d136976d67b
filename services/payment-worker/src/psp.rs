//! The payment provider client. One stable key per order and action
//! (`pay:<order_id>`, `refund:<order_id>`); only what is retryable is
//! retried (connect error, timeout, 5xx, 429), with jittered exponential
//! backoff under a total deadline. A timeout is an unknown outcome, resolved
//! by asking the provider by key — never by charging with a new key.

use backon::{ExponentialBuilder, Retryable};
use serde::Deserialize;
use std::time::Duration;
use uuid::Uuid;

/// A payment as the provider reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct PspPayment {
    pub id: String,
    pub status: String,
    pub amount_minor: i64,
    #[serde(default)]
    pub failure_reason: Option<String>,
}

/// Why a call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum PspError {
    /// Worth retrying: connect error, timeout, 5xx, 429.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The provider refused the request itself (4xx): retrying cannot help.
    #[error("refused: {0}")]
    Refused(String),
}

impl PspError {
    fn retryable(&self) -> bool {
        matches!(self, PspError::Retryable(_))
    }
}

/// A client for one provider.
#[derive(Clone)]
pub struct Psp {
    http: reqwest::Client,
    base: String,
    deadline: Duration,
}

impl Psp {
    /// A client with a per-call `timeout` and a total `deadline` per action.
    pub fn new(base: &str, timeout: Duration, deadline: Duration) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(timeout).pool_max_idle_per_host(64).build()?;
        Ok(Psp { http, base: base.trim_end_matches('/').to_owned(), deadline })
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(usize::MAX)
            .with_total_delay(Some(self.deadline))
    }

    /// Charges the order, or learns the outcome of an earlier charge with the same key.
    pub async fn pay(&self, order_id: Uuid, amount_minor: i64, currency: &str) -> Result<PspPayment, PspError> {
        let key = format!("pay:{order_id}");
        let body = serde_json::json!({ "amount_minor": amount_minor, "currency": currency, "reference": order_id.to_string() });
        (|| async {
            match self.post(&format!("{}/v1/payments", self.base), &key, &body).await {
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

    /// Refunds a payment in full, idempotently by `refund:<order_id>`.
    pub async fn refund(&self, payment_id: &str, order_id: Uuid) -> Result<(), PspError> {
        let key = format!("refund:{order_id}");
        let url = format!("{}/v1/payments/{payment_id}/refunds", self.base);
        (|| async { self.post::<serde_json::Value>(&url, &key, &serde_json::json!({})).await.map(|_| ()) })
            .retry(self.backoff())
            .when(PspError::retryable)
            .await
    }

    /// The payment made with `key`, if any.
    pub async fn find_by_key(&self, key: &str) -> Result<Option<PspPayment>, PspError> {
        let response = self
            .http
            .get(format!("{}/v1/payments", self.base))
            .query(&[("idempotency_key", key)])
            .send()
            .await
            .map_err(|e| PspError::Retryable(e.to_string()))?;
        match response.status().as_u16() {
            404 => Ok(None),
            200 => response.json().await.map(Some).map_err(|e| PspError::Retryable(e.to_string())),
            s => Err(classify(s)),
        }
    }

    async fn post<T: serde::de::DeserializeOwned>(&self, url: &str, key: &str, body: &serde_json::Value) -> Result<T, PspError> {
        let started = std::time::Instant::now();
        let sent = self.http.post(url).header("idempotency-key", key).json(body).send().await;
        metrics::histogram!("soldonce_psp_latency_seconds").record(started.elapsed().as_secs_f64());
        let response = sent.map_err(|e| {
            if e.is_timeout() {
                metrics::counter!("soldonce_psp_timeouts_total").increment(1);
            }
            PspError::Retryable(e.to_string())
        })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(classify(status));
        }
        response.json().await.map_err(|e| PspError::Retryable(format!("unreadable reply: {e}")))
    }
}

fn classify(status: u16) -> PspError {
    if status == 429 || status >= 500 {
        PspError::Retryable(format!("HTTP {status}"))
    } else {
        PspError::Refused(format!("HTTP {status}"))
    }
}
