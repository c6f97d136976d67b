//! The order aggregate: `decide` turns a command into events against the
//! current state, `evolve` folds one event into the state. An order's state
//! is exactly the fold of its events; the `orders` table is a cache of it.

pub use crate::command::{Command, PlaceOrder};
pub use crate::error::DomainError;
pub use crate::event::Event;
pub use crate::state::{Capture, Order, OrderLine, OrderState, PaymentRef, Shipping, MAX_LINES};

use crate::dispute;
use crate::money::Money;
use crate::payment;

/// Decides which events a command produces against the current state.
pub fn decide(state: Option<&Order>, command: Command) -> Result<Vec<Event>, DomainError> {
    let Command::Place(place) = command else {
        let order = state.ok_or(DomainError::NotFound)?;
        return decide_existing(order, command);
    };
    if state.is_some() {
        return Err(DomainError::AlreadyExists);
    }
    if place.lines.is_empty() || place.lines.len() > MAX_LINES {
        return Err(DomainError::LineCount(place.lines.len()));
    }
    let currency = place.lines[0].2.currency;
    let mut total = Money::zero(currency);
    let mut lines: Vec<OrderLine> = Vec::with_capacity(place.lines.len());
    for (sku, quantity, price) in place.lines {
        if lines.iter().any(|l| l.sku == sku) {
            return Err(DomainError::DuplicateSku(sku));
        }
        total = total.checked_add(price.checked_mul(quantity.get())?)?;
        lines.push(OrderLine {
            sku,
            quantity,
            unit_price_minor: price.minor,
        });
    }
    lines.sort_by(|a, b| a.sku.cmp(&b.sku));
    Ok(vec![Event::Placed {
        order_id: place.order_id,
        account_id: place.account_id,
        lines,
        currency,
        total_minor: total.minor,
        shipping: place.shipping,
        expires_at: place.expires_at,
        at: place.placed_at,
    }])
}

fn decide_existing(order: &Order, command: Command) -> Result<Vec<Event>, DomainError> {
    use OrderState::*;
    let illegal = |action| {
        Err(DomainError::IllegalTransition {
            from: order.state,
            action,
        })
    };
    match (order.state, command) {
        (_, Command::Place(_)) => Err(DomainError::AlreadyExists),
        (
            _,
            Command::Paid {
                fact,
                units_gone,
                holdings,
            },
        ) => payment::decide_paid(order, fact, units_gone, &holdings),
        (_, Command::RecordRefund { payment_id, at }) => {
            payment::decide_refunded(order, &payment_id, at)
        }
        (Confirmed, Command::DecideCapture { at }) => Ok(payment::decide_capture(order, at)),
        (_, Command::DecideCapture { .. }) => illegal("capture the payment of"),
        (
            _,
            Command::RecordCapture {
                payment_id,
                amount_minor,
                at,
            },
        ) => payment::decide_captured(order, &payment_id, amount_minor, at),
        (_, Command::Dispute(fact)) => dispute::decide_disputed(order, fact),
        (
            _,
            Command::RecordRefundElsewhere {
                refund_id,
                payment_id,
                amount_minor,
                at,
            },
        ) => dispute::decide_refunded_elsewhere(order, refund_id, payment_id, amount_minor, at),
        (
            Confirmed,
            Command::RefundByOperator {
                key,
                amount_minor,
                at,
            },
        ) => crate::operator::decide_refund(order, &key, amount_minor, at),
        (_, Command::RefundByOperator { .. }) => illegal("refund"),
        (
            _,
            Command::CancelByOperator {
                shipped,
                reason,
                at,
            },
        ) => crate::operator::decide_cancel(order, shipped, &reason, at),
        (_, Command::RecordOperatorRefund { key, at }) => {
            crate::operator::decide_refunded(order, &key, at)
        }
        (
            _,
            Command::AwaitAction {
                payment_id,
                url,
                extension,
                at,
            },
        ) => Ok(crate::action::decide_await(
            order,
            &payment_id,
            &url,
            extension,
            at,
        )),
        (
            PaymentPending,
            Command::FailPayment {
                payment_id: Some(payment_id),
                abandoned: true,
                at,
                ..
            },
        ) if crate::action::awaits(order, &payment_id) => Ok(vec![Event::Expired { at }]),
        (
            PaymentPending,
            Command::FailPayment {
                payment_id,
                reason,
                at,
                ..
            },
        ) => Ok(vec![Event::PaymentFailed {
            payment_id,
            reason,
            at,
        }]),
        (PaymentFailed, Command::FailPayment { .. }) => Ok(vec![]),
        (PaymentPending, Command::Cancel { at }) => Ok(vec![Event::Cancelled { at }]),
        (PaymentPending, Command::Expire { at }) => {
            if at < order.expires_at {
                return Err(DomainError::NotYetExpired(order.expires_at));
            }
            Ok(vec![Event::Expired { at }])
        }
        (_, Command::FailPayment { .. }) => illegal("fail the payment of"),
        (_, Command::Cancel { .. }) => illegal("cancel"),
        (_, Command::Expire { .. }) => illegal("expire"),
    }
}

/// Folds one event into the state. Events are facts: `evolve` never refuses.
pub fn evolve(state: Option<Order>, event: &Event) -> Option<Order> {
    if let Event::Placed {
        order_id,
        account_id,
        lines,
        currency,
        total_minor,
        shipping,
        expires_at,
        at,
    } = event
    {
        return Some(Order {
            id: *order_id,
            account_id: *account_id,
            state: OrderState::PaymentPending,
            lines: lines.clone(),
            currency: *currency,
            total_minor: *total_minor,
            shipping: shipping.clone(),
            expires_at: *expires_at,
            created_at: *at,
            updated_at: *at,
            payment: None,
            refunds: Vec::new(),
            operator_refunds: Vec::new(),
            next_action: None,
            disputes: Vec::new(),
            version: 1,
        });
    }
    let mut order = state?;
    order.state = match event {
        Event::Placed { .. } => order.state,
        Event::Confirmed {
            payment_id,
            amount_minor,
            uncaptured,
            ..
        } => {
            order.payment = Some(PaymentRef {
                payment_id: payment_id.clone(),
                amount_minor: *amount_minor,
                capture: if *uncaptured {
                    Capture::Authorized
                } else {
                    Capture::Automatic
                },
            });
            OrderState::Confirmed
        }
        Event::RefundDecided { .. } | Event::Refunded { .. } => {
            payment::evolve_refund(&mut order, event);
            order.state
        }
        Event::CaptureDecided { .. } | Event::Captured { .. } => {
            payment::evolve_capture(&mut order, event);
            order.state
        }
        Event::OperatorRefundDecided { .. } | Event::OperatorRefunded { .. } => {
            crate::operator::evolve(&mut order, event);
            order.state
        }
        Event::OperatorCancelled { .. } => OrderState::Cancelled,
        Event::ActionRequired { .. } => {
            crate::action::evolve(&mut order, event);
            order.state
        }
        Event::Disputed { .. } => {
            dispute::evolve_disputed(&mut order, event);
            order.state
        }
        Event::RefundedElsewhere { .. } => order.state,
        Event::PaymentFailed { .. } => OrderState::PaymentFailed,
        Event::Cancelled { .. } => OrderState::Cancelled,
        Event::Expired { .. } => OrderState::Expired,
    };
    order.updated_at = event.at();
    order.version += 1;
    Some(order)
}

/// The state of an order with these events, in recorded order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> Option<Order> {
    events.into_iter().fold(None, evolve)
}

#[cfg(test)]
#[path = "order_tests.rs"]
mod tests;
