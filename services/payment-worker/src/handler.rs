//! On `order.placed`: charge the order once, then record what the PSP said.
//! The amount is the server-computed total read from the database, never
//! taken from the message. An order that is no longer pending is never
//! charged; its charge from before a crash is looked up by key. Whatever the
//! PSP answers is learned through the one store path every source shares: a
//! payment that cannot settle its order gets a refund recorded with it.

use crate::psp::{Psp, PspError, PspPayment};
use anyhow::Context;
use bus::consumer::{Delivery, HandleError, Handler};
use domain::OrderState;
use events::Metadata;
use sqlx::PgPool;
use store::inbox::PgInbox;
use store::payments::{Learned, Source};
use uuid::Uuid;

/// The payment worker's handler.
pub struct PayOrders {
    pub psp: Psp,
    /// The database, for reading the order outside the effect's transaction.
    pub pool: PgPool,
}

/// What the worker records because it handled `delivery`.
fn meta(delivery: &Delivery<PgInbox>) -> Metadata {
    Metadata::caused_by(
        "payment-worker",
        &delivery.event,
        delivery.traceparent.clone(),
    )
}

impl Handler for PayOrders {
    type Inbox = PgInbox;

    async fn handle(&self, delivery: &Delivery<PgInbox>) -> Result<(), HandleError> {
        let order_id = events::decode(&delivery.event)
            .map_err(|e| HandleError::Permanent(e.to_string()))?
            .order_id();
        let order = store::orders::load(&self.pool, order_id, None)
            .await
            .context("loading the order")?
            .ok_or_else(|| {
                HandleError::Permanent(format!("order {order_id} is not in the database"))
            })?;
        if order.total_minor == 0 {
            return self.confirm_free(delivery, &order).await;
        }
        let key = format!("pay:{order_id}");
        let payment = match order.state {
            // A redelivery may follow a charge whose reply was lost: ask by key first.
            OrderState::PaymentPending if delivery.delivered > 1 => {
                match self.psp.find_by_key(&key).await {
                    Ok(Some(p)) => Ok(p),
                    Ok(None) => {
                        self.psp
                            .pay(order_id, order.total_minor, order.currency.as_str())
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
            OrderState::PaymentPending => {
                self.psp
                    .pay(order_id, order.total_minor, order.currency.as_str())
                    .await
            }
            // Ended or settled meanwhile: never charge now, but learn of a charge made before.
            _ => match self.psp.find_by_key(&key).await {
                Ok(Some(p)) => Ok(p),
                Ok(None) => return Ok(()),
                Err(e) => Err(e),
            },
        }
        .map_err(|e| match e {
            PspError::Retryable(why) => {
                metrics::counter!("soldonce_psp_outcome_unknown_total").increment(1);
                HandleError::Transient(anyhow::anyhow!("payment outcome unknown for now: {why}"))
            }
            PspError::Refused(why) => {
                HandleError::Permanent(format!("the PSP refused the charge request: {why}"))
            }
        })?;
        self.record(delivery, order_id, &payment).await
    }
}

impl PayOrders {
    /// A free order (every line priced 0) is confirmed without asking the
    /// PSP, which refuses charges of 0: its payment is `free:<order_id>`.
    async fn confirm_free(
        &self,
        delivery: &Delivery<PgInbox>,
        order: &domain::Order,
    ) -> Result<(), HandleError> {
        let fact = store::payments::PaymentFact {
            payment_id: format!("{}{}", store::payments::FREE_PREFIX, order.id),
            order_id: Some(order.id),
            status: domain::PspStatus::Succeeded,
            amount_minor: 0,
            currency: order.currency.to_string(),
            failure_reason: None,
        };
        let Some(mut tx) = delivery.begin().await.context("writing the inbox row")? else {
            return Ok(());
        };
        let learned = store::payments::learn(&mut tx, &fact, Source::Free, &meta(delivery))
            .await
            .context("recording the free payment")?;
        tx.commit().await.context("committing the free payment")?;
        if matches!(learned, Learned::Confirmed { .. }) {
            metrics::counter!("soldonce_free_orders_confirmed_total").increment(1);
            tracing::info!(order_id = %order.id, "free order confirmed without a PSP call");
        }
        Ok(())
    }

    async fn record(
        &self,
        delivery: &Delivery<PgInbox>,
        order_id: Uuid,
        payment: &PspPayment,
    ) -> Result<(), HandleError> {
        let fact = payment.fact();
        if let domain::PspStatus::Unknown(status) = &fact.status {
            // Not a clear answer: never release, ask again by key on redelivery.
            metrics::counter!("soldonce_psp_outcome_unknown_total").increment(1);
            return Err(HandleError::Transient(anyhow::anyhow!(
                "payment {} is {status}; asking again by key",
                payment.id
            )));
        }
        let Some(mut tx) = delivery.begin().await.context("writing the inbox row")? else {
            tracing::info!(%order_id, "already handled by another delivery");
            return Ok(());
        };
        let learned = store::payments::learn(&mut tx, &fact, Source::Worker, &meta(delivery))
            .await
            .context("recording the payment")?;
        tx.commit().await.context("committing the payment")?;
        match learned {
            Learned::Confirmed { reclaimed, .. } => {
                metrics::counter!("soldonce_payments_authorized_minor_total")
                    .increment(u64::try_from(payment.amount_minor).unwrap_or(0));
                if reclaimed {
                    tracing::info!(%order_id, payment_id = %payment.id, "late payment reclaimed the expired order's units");
                }
            }
            Learned::RefundDecided(reason) => {
                metrics::counter!("soldonce_compensations_recorded_total", "reason" => reason.as_str(), "source" => "worker").increment(1);
                tracing::warn!(%order_id, payment_id = %payment.id, reason = reason.as_str(), "payment cannot settle the order: refund recorded");
            }
            Learned::Declined(_) | Learned::AlreadyKnown | Learned::Unknown(_) => {}
        }
        Ok(())
    }
}
