//! On `order.placed`: charge the order once, then record what the PSP said.
//! The amount is the server-computed total read from the database, never
//! taken from the message. An order that is no longer pending is never
//! charged; its charge from before a crash is looked up by key. Whatever the
//! PSP answers is learned through the one store path every source shares: a
//! payment that cannot settle its order gets a refund recorded with it.

use crate::psp::{Psp, PspError, PspPayment};
use anyhow::Context;
use bus::consumer::{message_span, Delivery, HandleError, Handler, Tx};
use domain::OrderState;
use events::Metadata;
use futures::stream::{FuturesUnordered, Stream};
use futures::{FutureExt, StreamExt};
use sqlx::PgPool;
use std::collections::HashMap;
use store::inbox::PgInbox;
use store::payments::{Learned, Source};
use tracing::Instrument;
use uuid::Uuid;

/// The payment worker's handler.
pub struct PayOrders {
    pub psp: Psp,
    /// The database, for reading the order outside the effect's transaction.
    pub pool: PgPool,
}

/// What the worker records because it handled `delivery`.
fn meta(delivery: &Delivery) -> Metadata {
    Metadata::caused_by(
        "payment-worker",
        &delivery.event,
        delivery.traceparent.clone(),
    )
    .with_tracestate(delivery.tracestate.clone())
}

/// The trace a PSP call continues: the delivery's span and `tracestate`.
fn trace(delivery: &Delivery) -> Option<(&str, Option<&str>)> {
    delivery
        .traceparent
        .as_deref()
        .map(|t| (t, delivery.tracestate.as_deref()))
}

/// What the PSP said about one order, ready to record.
pub enum Charged {
    /// A free order, settled without the PSP.
    Free(domain::Order),
    /// The PSP's clear answer.
    Paid { order_id: Uuid, payment: PspPayment },
    /// Nothing to record: the order ended before any charge.
    Nothing,
}

/// One recorded PSP answer, for the log lines and metrics after the commit.
pub struct Answer {
    order_id: Uuid,
    trace_id: String,
    payment_id: String,
    amount_minor: i64,
    /// The payment's ISO 4217 currency, the label of the money it counts.
    currency: String,
}

/// What recording a batch learned, answer by answer.
pub struct Learnt(Vec<(Answer, Learned)>);

/// The order a delivery names.
fn order_of(delivery: &Delivery) -> Result<Uuid, HandleError> {
    Ok(events::decode(&delivery.event)
        .map_err(|e| HandleError::Permanent(e.to_string()))?
        .order_id())
}

impl PayOrders {
    /// Charges `order` (or learns of its charge by key), outside any
    /// transaction; `order` is `None` when the database does not hold it.
    async fn charge(
        &self,
        delivery: &Delivery,
        order_id: Uuid,
        order: Option<domain::Order>,
    ) -> Result<Charged, HandleError> {
        let order = order.ok_or_else(|| {
            HandleError::Permanent(format!("order {order_id} is not in the database"))
        })?;
        if order.total_minor == 0 {
            return Ok(Charged::Free(order));
        }
        let key = format!("pay:{order_id}");
        let payment = match order.state {
            // A redelivery may follow a charge whose reply was lost: ask by key first.
            OrderState::PaymentPending if delivery.delivered > 1 => {
                match self.psp.find_by_key(&key).await {
                    Ok(Some(p)) => Ok(p),
                    Ok(None) => {
                        self.psp
                            .pay(
                                order_id,
                                order.total_minor,
                                order.currency.as_str(),
                                trace(delivery),
                            )
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
            OrderState::PaymentPending => {
                self.psp
                    .pay(
                        order_id,
                        order.total_minor,
                        order.currency.as_str(),
                        trace(delivery),
                    )
                    .await
            }
            // Ended or settled meanwhile: never charge now, but learn of a charge made before.
            _ => match self.psp.find_by_key(&key).await {
                Ok(Some(p)) => Ok(p),
                Ok(None) => return Ok(Charged::Nothing),
                Err(e) => Err(e),
            },
        }
        .map_err(|e| match e {
            PspError::Retryable(why) => {
                metrics::counter!("soldonce_psp_outcome_unknown_total").increment(1);
                HandleError::Transient(anyhow::anyhow!("payment outcome unknown for now: {why}"))
            }
            PspError::Refused(why) | PspError::NothingLeft(why) | PspError::WrongState(why) => {
                HandleError::Permanent(format!("the PSP refused the charge request: {why}"))
            }
        })?;
        if let domain::PspStatus::Unknown(status) = &payment.fact().status {
            // Not a clear answer: never release, ask again by key on redelivery.
            metrics::counter!("soldonce_psp_outcome_unknown_total").increment(1);
            return Err(HandleError::Transient(anyhow::anyhow!(
                "payment {} is {status}; asking again by key",
                payment.id
            )));
        }
        Ok(Charged::Paid { order_id, payment })
    }
}

impl Handler for PayOrders {
    type Inbox = PgInbox;
    type Prepared = Charged;
    type Recorded = Learnt;

    /// Charges the order (or learns of its charge by key), outside any
    /// transaction: the batch's PSP calls run at once.
    async fn prepare(&self, delivery: &Delivery) -> Result<Charged, HandleError> {
        let order_id = order_of(delivery)?;
        let order = store::orders::load(&self.pool, order_id, None)
            .await
            .context("loading the order")?;
        self.charge(delivery, order_id, order).await
    }

    /// The batch's orders are read in one query, then charged at once; each
    /// answer is yielded as it arrives, to be recorded while the others are
    /// still out.
    fn prepare_all<'a>(
        &'a self,
        consumer: &'a str,
        batch: &'a [&'a Delivery],
    ) -> impl Stream<Item = (usize, Result<Charged, HandleError>)> + Send + 'a {
        futures::stream::once(async move {
            let ids: Vec<Result<Uuid, HandleError>> = batch.iter().map(|d| order_of(d)).collect();
            let wanted: Vec<Uuid> = ids
                .iter()
                .filter_map(|id| id.as_ref().ok().copied())
                .collect();
            let orders: Result<HashMap<Uuid, domain::Order>, String> =
                store::orders::load_many(&self.pool, &wanted)
                    .await
                    .map(|found| found.into_iter().map(|o| (o.id, o)).collect())
                    .map_err(|e| format!("loading the batch's orders: {e}"));
            batch
                .iter()
                .zip(ids)
                .enumerate()
                .map(|(i, (d, id))| {
                    // Two deliveries may name one order (its events redelivered): each gets it.
                    let order = orders
                        .as_ref()
                        .map(|found| id.as_ref().ok().and_then(|id| found.get(id).cloned()))
                        .map_err(Clone::clone);
                    async move {
                        let order =
                            order.map_err(|why| HandleError::Transient(anyhow::anyhow!(why)))?;
                        self.charge(d, id?, order).await
                    }
                    .map(move |r| (i, r))
                    .instrument(message_span(consumer, d))
                })
                .collect::<FuturesUnordered<_>>()
        })
        .flatten()
    }

    /// Learns every answer of the batch in the one transaction, through the
    /// path every source shares.
    async fn record(
        &self,
        tx: &mut Tx<Self>,
        batch: &[(&Delivery, &Charged)],
    ) -> Result<Learnt, HandleError> {
        let mut facts = Vec::with_capacity(batch.len());
        let mut about = Vec::with_capacity(batch.len());
        for (delivery, charged) in batch {
            let (order_id, fact, source) = match charged {
                Charged::Free(order) => (
                    order.id,
                    store::payments::PaymentFact {
                        payment_id: format!("{}{}", store::payments::FREE_PREFIX, order.id),
                        order_id: Some(order.id),
                        status: domain::PspStatus::Succeeded,
                        amount_minor: 0,
                        currency: order.currency.to_string(),
                        failure_reason: None,
                        abandoned: false,
                        next_action_url: None,
                    },
                    Source::Free,
                ),
                Charged::Paid { order_id, payment } => {
                    (*order_id, payment.fact_for(*order_id), Source::Worker)
                }
                Charged::Nothing => continue,
            };
            about.push(Answer {
                order_id,
                trace_id: delivery.trace_id(),
                payment_id: fact.payment_id.clone(),
                amount_minor: fact.amount_minor,
                currency: fact.currency.clone(),
            });
            facts.push((fact, source, meta(delivery)));
        }
        let learned = store::payments::learn_many(tx, &facts)
            .await
            .context("recording the payments")?;
        Ok(Learnt(about.into_iter().zip(learned).collect()))
    }

    fn committed(&self, Learnt(learnt): Learnt) {
        for (answer, learned) in learnt {
            let Answer {
                order_id,
                trace_id,
                payment_id,
                amount_minor,
                currency,
            } = answer;
            match learned {
                Learned::Confirmed { reclaimed, .. } => {
                    if payment_id.starts_with(store::payments::FREE_PREFIX) {
                        metrics::counter!("soldonce_free_orders_confirmed_total").increment(1);
                        tracing::info!(%order_id, %trace_id, "free order confirmed without a PSP call");
                        continue;
                    }
                    metrics::counter!("soldonce_payments_authorized_minor_total", "currency" => currency)
                        .increment(u64::try_from(amount_minor).unwrap_or(0));
                    if reclaimed {
                        tracing::info!(%order_id, %trace_id, %payment_id, "late payment reclaimed the expired order's units");
                    } else {
                        tracing::info!(%order_id, %trace_id, %payment_id, amount_minor, "payment recorded: order confirmed");
                    }
                }
                Learned::RefundDecided(reason) => {
                    metrics::counter!("soldonce_compensations_recorded_total", "reason" => reason.as_str(), "source" => "worker").increment(1);
                    tracing::warn!(%order_id, %trace_id, %payment_id, reason = reason.as_str(), "payment cannot settle the order: refund recorded");
                }
                Learned::Declined(_) => {
                    tracing::info!(%order_id, %trace_id, %payment_id, "payment declined: order failed");
                }
                // A webhook (or a redelivery) got there first.
                Learned::AlreadyKnown => {
                    tracing::info!(%order_id, %trace_id, %payment_id, "payment recorded: already known");
                }
                Learned::AwaitingAction => {
                    metrics::counter!("soldonce_payments_awaiting_action_total").increment(1);
                    tracing::info!(%order_id, %trace_id, %payment_id, "payment awaits the buyer's action (3-D Secure)");
                }
                Learned::Unknown(status) => {
                    tracing::warn!(%order_id, %trace_id, %payment_id, status = %status, "payment recorded: a status soldonce does not know");
                }
                // Only when the order is not in the database: the charge was refused before this.
                Learned::Foreign => {
                    tracing::error!(%order_id, %trace_id, %payment_id, "payment for an order soldonce does not hold: left alone");
                }
            }
        }
    }
}
