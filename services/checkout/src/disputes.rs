//! `dispute.created` webhooks: the buyer's bank took money back from a
//! payment. The dispute is recorded on the order that holds the payment
//! (once per dispute id), its shipment held if it has not shipped, and a
//! finding opened for a person — in one transaction with the webhook's
//! receipt. A dispute of a payment soldonce does not hold is a receipt only.

use crate::error::ApiError;
use crate::logging::RequestTrace;
use crate::AppState;
use axum::http::StatusCode;
use store::disputes::{DisputeReport, Recorded};

/// Records a `dispute.created` webhook (`report`: `None` when its body
/// lacks the payment or a valid amount).
pub(crate) async fn receive(
    state: &AppState,
    trace: &RequestTrace,
    webhook_id: &str,
    report: Option<DisputeReport>,
) -> Result<StatusCode, ApiError> {
    let _slot = crate::webhook_slots::writing_slot(state).await?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    if !store::payments::record_webhook(&mut tx, webhook_id, "dispute.created", None).await? {
        metrics::counter!("soldonce_webhooks_total", "outcome" => "duplicate").increment(1);
        return Ok(StatusCode::OK);
    }
    let recorded = match &report {
        Some(report) => {
            store::disputes::record(&mut tx, report, |order_id| trace.meta(order_id)).await?
        }
        None => Recorded::Foreign,
    };
    tx.commit().await.map_err(store::StoreError::from)?;
    let outcome = match &recorded {
        Recorded::New { held: true, .. } => "held",
        Recorded::New { held: false, .. } => "recorded",
        Recorded::AlreadyKnown(_) => "already_known",
        Recorded::Foreign => "foreign",
    };
    metrics::counter!("soldonce_disputes_total", "outcome" => outcome).increment(1);
    metrics::counter!("soldonce_webhooks_total", "outcome" => "dispute").increment(1);
    let (dispute_id, payment_id) = report.as_ref().map_or(("?", "?"), |r| {
        (r.dispute_id.as_str(), r.payment_id.as_str())
    });
    match recorded {
        Recorded::New {
            order_id,
            finding_id,
            held,
        } => tracing::warn!(
            %order_id, trace_id = trace.trace_id(), webhook_id, dispute_id, payment_id, finding_id, held,
            "dispute recorded: a person must answer it at the PSP (soldonce findings list)"
        ),
        Recorded::AlreadyKnown(order_id) => tracing::info!(
            %order_id, webhook_id, dispute_id, "dispute already recorded"
        ),
        Recorded::Foreign => {
            tracing::warn!(
            webhook_id, dispute_id, payment_id,
            "dispute of a payment soldonce does not hold (or an incomplete report): receipt only"
        )
        }
    }
    Ok(StatusCode::OK)
}

/// Records a `refund.succeeded` that completed no compensation: a refund of
/// an order's payment soldonce did not make is named to a person and holds
/// the order's shipment, like a dispute; soldonce's own operator refunds
/// and payments it holds no order on are left alone.
pub(crate) async fn refunded_elsewhere(
    state: &AppState,
    trace: &RequestTrace,
    payment_id: &str,
    refund_id: &str,
    amount_minor: i64,
) -> Result<(), ApiError> {
    use store::refunds_elsewhere::Recorded as Elsewhere;
    let _slot = crate::webhook_slots::writing_slot(state).await?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    let recorded = store::refunds_elsewhere::record(
        &mut tx,
        payment_id,
        refund_id,
        amount_minor,
        |order_id| trace.meta(order_id),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    let outcome = match &recorded {
        Elsewhere::New { held: true, .. } => "held",
        Elsewhere::New { held: false, .. } => "recorded",
        Elsewhere::AlreadyKnown(_) => "already_known",
        Elsewhere::Ours => "ours",
        Elsewhere::NotAttached => "not_attached",
    };
    metrics::counter!("soldonce_refunds_elsewhere_total", "outcome" => outcome).increment(1);
    if let Elsewhere::New {
        order_id,
        finding_id,
        held,
    } = recorded
    {
        tracing::warn!(
            %order_id, trace_id = trace.trace_id(), refund_id, payment_id, finding_id, held,
            "a refund soldonce did not make: a person must look at it (soldonce findings list)"
        );
    }
    Ok(())
}
