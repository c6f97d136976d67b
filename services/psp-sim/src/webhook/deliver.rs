//! Delivering one webhook: a signed POST, retried with jittered exponential backoff until the
//! receiver answers 2xx or the retry budget runs out.

use platform::otel::{Hop, Kind};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use chrono::Utc;
use reqwest::header::CONTENT_TYPE;
use reqwest::{StatusCode, Url};

use super::WebhookEvent;
use crate::counters::Counters;
use crate::settings::WebhookTarget;
use crate::signature::{sign, WebhookSecret};

/// First retry after 50-100 ms (jitter adds up to the delay again), so tests converge quickly.
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// Longest pause between attempts, before jitter.
const LONGEST_PAUSE: Duration = Duration::from_secs(10);
/// Stop retrying once the pauses would add up to more than a day.
const RETRY_BUDGET: Duration = Duration::from_secs(24 * 60 * 60);
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client for webhooks could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the webhook HTTP client: {0}")]
pub struct BuildClientError(#[from] reqwest::Error);

/// Sends webhooks to one receiver.
#[derive(Debug)]
pub struct Deliverer {
    client: reqwest::Client,
    url: Url,
    secret: WebhookSecret,
    policy: ExponentialBuilder,
    counters: Arc<Counters>,
}

#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("request failed: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("receiver answered {0}")]
    Refused(StatusCode),
}

impl Deliverer {
    /// A deliverer for this receiver.
    pub fn new(target: WebhookTarget, counters: Arc<Counters>) -> Result<Self, BuildClientError> {
        let client = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .build()?;
        let policy = ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(FIRST_RETRY)
            .with_max_delay(LONGEST_PAUSE)
            .without_max_times()
            .with_total_delay(Some(RETRY_BUDGET));
        Ok(Self {
            client,
            url: target.url,
            secret: target.secret,
            policy,
            counters,
        })
    }

    /// Delivers one copy of the event, retrying until acknowledged or out of budget.
    #[tracing::instrument(skip_all, fields(
        webhook_id = %event.id,
        event_type = %event.event_type,
        order_id = event.reference.as_deref(),
        trace_id = event.traceparent.map(|t| t.trace_id()),
    ))]
    pub async fn deliver(&self, event: &WebhookEvent) {
        let outcome = (|| self.attempt(event))
            .retry(self.policy)
            .sleep(tokio::time::sleep)
            .notify(|error, pause| tracing::debug!(%error, ?pause, "webhook attempt failed"))
            .await;
        match outcome {
            Ok(()) => {
                self.counters.webhook_finished(true);
                tracing::info!("webhook acknowledged");
            }
            Err(error) => {
                self.counters.webhook_finished(false);
                tracing::warn!(%error, "webhook abandoned after its retry budget");
            }
        }
    }

    async fn attempt(&self, event: &WebhookEvent) -> Result<(), AttemptError> {
        // Each attempt is signed with its own time, as Standard Webhooks receivers check the age.
        let timestamp = Utc::now().timestamp();
        let signature = sign(&self.secret, &event.id, timestamp, &event.body);
        let request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature);
        // Each attempt is a client span under the call that caused the webhook.
        let mut hop = event.traceparent.map(|parent| {
            let mut hop = Hop::start(Kind::Client, "POST webhook", Some(parent))
                .with_tracestate(event.tracestate.clone());
            hop.attribute("http.request.method", "POST");
            hop.attribute("webhook.id", event.id.clone());
            hop
        });
        let result = match &hop {
            Some(hop) => match hop.tracestate() {
                Some(state) => request
                    .header("traceparent", hop.traceparent().to_string())
                    .header("tracestate", state),
                None => request.header("traceparent", hop.traceparent().to_string()),
            },
            None => request,
        }
        .body(event.body.clone())
        .send()
        .await
        .map_err(AttemptError::from)
        .and_then(|response| match response.status() {
            status if status.is_success() => Ok(()),
            status => Err(AttemptError::Refused(status)),
        });
        if let (Some(hop), Err(e)) = (hop.as_mut(), &result) {
            hop.fail(e);
        }
        self.counters.webhook_attempted(result.is_ok());
        result
    }
}
