//! `POST /v1/psp/webhooks`: the payment provider's signed callbacks
//! (Standard Webhooks v1). The signature is checked over the raw body before
//! anything is parsed; the webhook id is recorded in the same transaction as
//! the effect, so a repeat is a no-op; whichever of the worker's synchronous
//! reply and this webhook arrives first advances the order. A payment that
//! cannot settle its order is answered like any other: the refund it needs
//! is recorded with the receipt, and the payment worker carries it out.

use crate::error::ApiError;
use crate::webhook_payload::{consistent, Callback};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use store::payments::{Learned, PaymentFact, Source};
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// How far a webhook's timestamp may be from our clock. Webhook receipts
/// must be kept longer than this (expiry's `RETENTION` is checked against
/// it), or a captured webhook could be replayed once its receipt is purged.
const TOLERANCE_SECS: u64 = platform::config::WEBHOOK_TOLERANCE.as_secs();

/// Shortest signing key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 24;

/// Signing secrets, newest first; several are accepted during a rotation.
#[derive(Clone, Default)]
pub struct Secrets(Vec<Vec<u8>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} redacted)", self.0.len())
    }
}

impl Secrets {
    /// Parses `WEBHOOK_SECRET`: one or more space-separated `whsec_<base64>` secrets.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = vec![];
        for s in text.split_whitespace() {
            let b64 = s
                .strip_prefix("whsec_")
                .ok_or_else(|| "each secret must start with whsec_".to_owned())?;
            let key = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "a secret is not valid base64".to_owned())?;
            if key.len() < MIN_KEY_BYTES {
                return Err(format!("each key must be at least {MIN_KEY_BYTES} bytes (32 base64 characters after whsec_), got {}", key.len()));
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err("no secret given".to_owned());
        }
        Ok(Secrets(keys))
    }

    /// Whether any `v1,<sig>` in `header` is a valid signature of `id.ts.body`.
    pub fn verify(&self, id: &str, ts: &str, body: &[u8], header: &str) -> bool {
        let mut valid = false;
        for key in &self.0 {
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
                continue;
            };
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(ts.as_bytes());
            mac.update(b".");
            mac.update(body);
            let expected = mac.finalize().into_bytes();
            for candidate in header.split_whitespace() {
                let Some(sig) = candidate.strip_prefix("v1,") else {
                    continue;
                };
                let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(sig) else {
                    continue;
                };
                valid |= bool::from(sig.as_slice().ct_eq(expected.as_slice()));
            }
        }
        valid
    }
}

/// A webhook whose status contradicts its type: its receipt is recorded
/// (so it is on file, and a repeat is recognised), nothing else changes,
/// and the PSP hears `400`.
async fn mismatched(
    state: &AppState,
    trace: &crate::logging::RequestTrace,
    order_id: Option<Uuid>,
    webhook_id: &str,
    callback: &Callback,
) -> ApiError {
    let event_type: String = callback.event_type.chars().take(64).collect();
    let status: String = callback
        .data
        .status
        .as_deref()
        .unwrap_or("")
        .chars()
        .take(64)
        .collect();
    metrics::counter!("soldonce_webhooks_total", "outcome" => "mismatch").increment(1);
    tracing::warn!(
        order_id = order_id.map(tracing::field::display),
        trace_id = trace.trace_id(),
        webhook_id,
        event_type,
        status,
        "webhook's status contradicts its type: refused, receipt kept"
    );
    let recorded = async {
        let _slot = crate::webhook_slots::writing_slot(state).await?;
        let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
        store::payments::record_webhook(&mut tx, webhook_id, &event_type, order_id).await?;
        tx.commit().await.map_err(store::StoreError::from)?;
        Ok::<_, ApiError>(())
    };
    match recorded.await {
        Ok(()) => ApiError::WebhookMismatch { event_type, status },
        Err(e) => e,
    }
}

fn reject(reason: &'static str) -> ApiError {
    metrics::counter!("soldonce_webhooks_rejected_total", "reason" => reason).increment(1);
    ApiError::Unauthorized(reason)
}

/// Checks the Standard Webhooks headers and signature; returns the webhook id.
pub fn authenticate(
    secrets: &Secrets,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, ApiError> {
    let get = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let (Some(id), Some(ts), Some(sig)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return Err(reject(
            "missing webhook-id, webhook-timestamp or webhook-signature",
        ));
    };
    if id.len() > 255 {
        return Err(reject("webhook-id is longer than 255 characters"));
    }
    let when: i64 = ts
        .parse()
        .map_err(|_| reject("webhook-timestamp is not unix seconds"))?;
    // abs_diff: no overflow for any i64 an attacker sends. The database's clock, not this host's.
    if store::now().timestamp().abs_diff(when) > TOLERANCE_SECS {
        return Err(reject(
            "webhook-timestamp is outside the 5 minute tolerance",
        ));
    }
    if !secrets.verify(id, ts, body, sig) {
        return Err(reject("no valid signature"));
    }
    Ok(id.to_owned())
}

/// How many times a webhook reporting a success the store does not know
/// yet looks again whether its payment got recorded, and how far apart,
/// before it takes the order's lock to learn it itself.
const LOOKS: u32 = 4;
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// Receives one webhook.
pub(crate) async fn receive(
    State(state): State<AppState>,
    trace: crate::logging::RequestTrace,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let Some(secrets) = state.webhook_secrets.as_ref() else {
        return Err(ApiError::NotConfigured(
            "webhooks are not configured (set WEBHOOK_SECRET)",
        ));
    };
    let body = body?;
    let webhook_id = authenticate(secrets, &headers, &body)?;
    let callback: Callback = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Invalid(format!("webhook body: {e}")))?;
    let order_id = callback
        .data
        .reference
        .as_deref()
        .and_then(|r| r.parse::<Uuid>().ok());
    if !consistent(&callback) {
        return Err(mismatched(&state, &trace, order_id, &webhook_id, &callback).await);
    }
    if callback.event_type == "refund.succeeded"
        && callback.data.status.as_deref() == Some("succeeded")
    {
        refund_succeeded(&state, &trace, &callback).await?;
    }
    if callback.event_type == "dispute.created" {
        let report = callback.data.dispute_report();
        return crate::disputes::receive(&state, &trace, &webhook_id, report).await;
    }
    let fact = callback
        .event_type
        .starts_with("payment.")
        .then(|| callback.data.payment_fact())
        .flatten();
    if let Some(fact) = fact.as_ref().filter(|f| f.status.is_paid()) {
        if recorded_soon(&state, &fact.payment_id).await? {
            return Ok(applied(&trace, order_id, &webhook_id, &callback));
        }
    }
    let (webhook_id, fact) = (webhook_id.as_str(), fact.as_ref());
    learn_with_receipt(&state, &trace, order_id, webhook_id, &callback, fact).await
}

/// A refund the PSP reports done: it closes the compensation it was for,
/// or else is recorded as a refund made elsewhere.
async fn refund_succeeded(
    state: &AppState,
    trace: &crate::logging::RequestTrace,
    callback: &Callback,
) -> Result<(), ApiError> {
    // Idempotent on its own: a refund is recorded once, whoever learns of it first.
    // Only a refund of a stated amount can close a compensation (of that amount).
    if let (Some(payment_id), Some(amount)) = (
        callback.data.payment_id.as_deref(),
        callback.data.amount_minor,
    ) {
        let completed = {
            let _slot = crate::webhook_slots::writing_slot(state).await?;
            store::compensations::complete(
                &state.pool,
                payment_id,
                &callback.data.id,
                Some(amount),
                "checkout",
            )
            .await?
        };
        if !completed {
            crate::disputes::refunded_elsewhere(
                state,
                trace,
                payment_id,
                &callback.data.id,
                amount,
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether the store knows the payment, now or after a few short looks
/// that hold nothing: then the webhook has nothing to learn.
async fn recorded_soon(state: &AppState, payment_id: &str) -> Result<bool, ApiError> {
    // Most webhooks tell what the worker's batch already recorded: a
    // payment the store knows is a fact learned, whatever the webhook says
    // of it again, so it is answered from one read, with no write and no
    // commit (under load this is one commit per order saved).
    //
    // A success not known yet is most often one the worker is recording
    // right now: the PSP sends its webhook as it answers the worker's
    // charge, and the worker's batch commits within milliseconds. So the
    // webhook looks again a few times, holding nothing, before it takes the
    // order's lock itself. Trying the lock first cost a transaction that
    // found the order locked and rolled back (four round trips and an
    // error in the server's log), for about a quarter of all orders under
    // load (`scripts/bench/statements.sh`). A payment the worker never
    // records (its reply was lost, the worker is down) is learned here
    // about 40 ms later than it could be. The looks of every webhook in
    // progress are asked together, on one connection (`known.rs`).
    for look in 0..=LOOKS {
        if look > 0 {
            tokio::time::sleep(LOOK_EVERY).await;
        }
        if state.known_payments.is_known(payment_id).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Records the webhook's receipt and learns its payment fact, if any, in
/// one transaction; a repeat of a webhook already received changes nothing.
async fn learn_with_receipt(
    state: &AppState,
    trace: &crate::logging::RequestTrace,
    order_id: Option<Uuid>,
    webhook_id: &str,
    callback: &Callback,
    fact: Option<&PaymentFact>,
) -> Result<StatusCode, ApiError> {
    let _slot = crate::webhook_slots::writing_slot(state).await?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    if !store::payments::record_webhook(&mut tx, webhook_id, &callback.event_type, order_id).await?
    {
        metrics::counter!("soldonce_webhooks_total", "outcome" => "duplicate").increment(1);
        return Ok(StatusCode::OK);
    }
    let outcome = match fact {
        Some(fact) => {
            // The PSP's webhook continues the order's trace (its traceparent
            // is one hop on from the worker's charge), and so do its events.
            let meta = trace.meta(order_id.unwrap_or_default());
            // Never queue behind another decider of the order.
            match store::payments::learn_unless_busy(&mut tx, fact, Source::Webhook, &meta).await {
                Err(e) if e.is_busy() => {
                    // Another decider holds the order (a success was looked for
                    // above already): the PSP delivers it again later.
                    tx.rollback().await.map_err(store::StoreError::from)?;
                    return Err(redeliver_later(trace, order_id, webhook_id));
                }
                learned => learned?,
            }
        }
        None => Learned::AlreadyKnown,
    };
    if matches!(outcome, Learned::AlreadyKnown) && fact.is_some() {
        // Nothing learned (the worker's batch recorded it while this waited
        // for the order's lock): no receipt is needed, so nothing is committed.
        tx.rollback().await.map_err(store::StoreError::from)?;
    } else {
        tx.commit().await.map_err(store::StoreError::from)?;
    }
    Ok(answered(trace, order_id, webhook_id, callback, outcome))
}

/// Counts and logs a webhook whose order another decider holds; the `503`
/// asks the PSP to deliver it again.
fn redeliver_later(
    trace: &crate::logging::RequestTrace,
    order_id: Option<Uuid>,
    webhook_id: &str,
) -> ApiError {
    metrics::counter!("soldonce_webhooks_total", "outcome" => "busy").increment(1);
    tracing::debug!(
        order_id = order_id.map(tracing::field::display),
        trace_id = trace.trace_id(),
        webhook_id,
        "webhook's order is being decided: asked the PSP to redeliver"
    );
    ApiError::Unavailable("the webhook's order is being decided right now; deliver it again".into())
}

/// A webhook about a payment already recorded: nothing to learn, `200`.
fn applied(
    trace: &crate::logging::RequestTrace,
    order_id: Option<Uuid>,
    webhook_id: &str,
    callback: &Callback,
) -> StatusCode {
    answered(trace, order_id, webhook_id, callback, Learned::AlreadyKnown)
}

/// Counts and logs a webhook answered with `200`.
fn answered(
    trace: &crate::logging::RequestTrace,
    order_id: Option<Uuid>,
    webhook_id: &str,
    callback: &Callback,
    outcome: Learned,
) -> StatusCode {
    let label = match outcome {
        Learned::Confirmed { .. } => "confirmed",
        Learned::RefundDecided(_) => "refund_decided",
        Learned::Declined(_) => "declined",
        Learned::AlreadyKnown => "applied",
        Learned::Unknown(_) => "unknown_status",
        Learned::AwaitingAction => "awaiting_action",
        Learned::Foreign => "foreign",
    };
    metrics::counter!("soldonce_webhooks_total", "outcome" => label).increment(1);
    tracing::info!(
        order_id = order_id.map(tracing::field::display),
        trace_id = trace.trace_id(),
        webhook_id,
        event_type = %callback.event_type.chars().take(64).collect::<String>(),
        outcome = label,
        "webhook recorded"
    );
    StatusCode::OK
}
