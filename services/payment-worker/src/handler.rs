//! On `order.placed`: charge the order once, then record the verdict. The
//! amount is the server-computed total read from the database, never taken
//! from the message. A success for an order that has since expired or been
//! cancelled reclaims its units if they are still there, and is refunded if
//! they are not.

use crate::psp::{Psp, PspError};
use bus::consumer::{Delivery, HandleError, Handler};
use domain::{Command, OrderState};
use store::envelope::Metadata;
use store::orders::Transition;
use store::payments::Verdict;
use uuid::Uuid;

/// The payment worker's handler.
pub struct PayOrders {
    pub psp: Psp,
}

fn meta(delivery: &Delivery, order_id: Uuid) -> Metadata {
    Metadata {
        correlation_id: order_id,
        causation_id: delivery.event.id,
        source: "payment-worker".into(),
        traceparent: delivery.traceparent.clone(),
    }
}

impl Handler for PayOrders {
    async fn handle(&self, delivery: &Delivery) -> Result<(), HandleError> {
        let order_id: Uuid = delivery.event.data["order_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| HandleError::Permanent("order.placed without an order_id".into()))?;
        let order = store::orders::load(delivery.pool(), order_id, None)
            .await?
            .ok_or_else(|| HandleError::Permanent(format!("order {order_id} is not in the database")))?;
        let payment = match order.state {
            OrderState::PaymentPending => self.psp.pay(order_id, order.total_minor, order.currency.as_str()).await,
            // Ended before we settled it: we may have charged it before a crash; ask by key, never charge now.
            OrderState::Expired | OrderState::Cancelled => match self.psp.find_by_key(&format!("pay:{order_id}")).await {
                Ok(Some(p)) if p.status == "succeeded" => Ok(p),
                Ok(_) => return Ok(()),
                Err(e) => Err(e),
            },
            // Already settled (perhaps by the webhook): nothing to do.
            _ => return Ok(()),
        }
        .map_err(|e| match e {
            PspError::Retryable(why) => {
                metrics::counter!("soldonce_psp_outcome_unknown_total").increment(1);
                HandleError::Transient(anyhow::anyhow!("payment outcome unknown for now: {why}"))
            }
            PspError::Refused(why) => HandleError::Permanent(format!("the PSP refused the charge request: {why}")),
        })?;
        let verdict = if payment.status == "succeeded" {
            metrics::counter!("soldonce_payments_authorized_minor_total").increment(u64::try_from(payment.amount_minor).unwrap_or(0));
            Verdict::Succeeded { payment_id: payment.id.clone(), amount_minor: payment.amount_minor }
        } else {
            Verdict::Failed { payment_id: payment.id.clone(), reason: payment.failure_reason.clone().unwrap_or_else(|| "declined".into()) }
        };
        let Some(mut tx) = delivery.begin().await? else {
            tracing::info!(%order_id, "already handled by another delivery");
            return Ok(());
        };
        match store::payments::settle(&mut tx, order_id, &verdict, &meta(delivery, order_id)).await? {
            Transition::StockShort(sku) => {
                drop(tx);
                tracing::warn!(%order_id, %sku, "late payment but the units are gone: refunding");
                self.refund(delivery, order_id, &payment.id, payment.amount_minor).await
            }
            Transition::Refused(why) => {
                tracing::warn!(%order_id, %why, "verdict not applicable to the order's state");
                tx.commit().await?;
                Ok(())
            }
            _ => {
                tx.commit().await?;
                Ok(())
            }
        }
    }
}

impl PayOrders {
    async fn refund(&self, delivery: &Delivery, order_id: Uuid, payment_id: &str, amount_minor: i64) -> Result<(), HandleError> {
        self.psp.refund(payment_id, order_id).await.map_err(|e| HandleError::Transient(e.into()))?;
        metrics::counter!("soldonce_compensations_total", "kind" => "refund").increment(1);
        let Some(mut tx) = delivery.begin().await? else { return Ok(()) };
        let at = store::now();
        let payment_id = payment_id.to_owned();
        store::orders::transition_in(&mut tx, order_id, None, &meta(delivery, order_id), |_| Command::Refund {
            payment_id,
            amount_minor,
            at,
        })
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
