//! Disputes (chargebacks): the buyer's bank takes money back from a payment
//! the order was settled on. soldonce does not decide a dispute (a person
//! answers it at the PSP); it records the fact on the order, once per
//! dispute id, however often and in whatever order the PSP reports it. A
//! refund of the order's payment made outside soldonce is recorded the
//! same way (`order.refunded_elsewhere`): money went back without it.

use crate::error::DomainError;
use crate::event::Event;
pub use crate::state::DisputeRef;
use crate::state::Order;
use chrono::{DateTime, Utc};

/// What the PSP reports when a dispute is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisputeFact {
    pub dispute_id: String,
    pub payment_id: String,
    pub amount_minor: i64,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// Records a refund of the order's payment that soldonce did not make.
/// Only the payment the order stands on: a refund elsewhere of one soldonce
/// is refunding itself completes that refund instead.
pub(crate) fn decide_refunded_elsewhere(
    order: &Order,
    refund_id: String,
    payment_id: String,
    amount_minor: i64,
    at: DateTime<Utc>,
) -> Result<Vec<Event>, DomainError> {
    let attached = order
        .payment
        .as_ref()
        .is_some_and(|p| p.payment_id == payment_id);
    if !attached || amount_minor < 1 {
        return Err(DomainError::NotDisputable(payment_id));
    }
    Ok(vec![Event::RefundedElsewhere {
        refund_id,
        payment_id,
        amount_minor,
        at,
    }])
}

/// Records a dispute of one of the order's payments (the one it is settled
/// on, or one it decided to refund): once per dispute id.
pub(crate) fn decide_disputed(order: &Order, fact: DisputeFact) -> Result<Vec<Event>, DomainError> {
    if order
        .disputes
        .iter()
        .any(|d| d.dispute_id == fact.dispute_id)
    {
        return Ok(vec![]);
    }
    let names = order
        .payment
        .as_ref()
        .is_some_and(|p| p.payment_id == fact.payment_id)
        || order.refund_of(&fact.payment_id).is_some();
    if !names || fact.amount_minor < 0 {
        return Err(DomainError::NotDisputable(fact.payment_id));
    }
    Ok(vec![Event::Disputed {
        dispute_id: fact.dispute_id,
        payment_id: fact.payment_id,
        amount_minor: fact.amount_minor,
        reason: fact.reason,
        at: fact.at,
    }])
}

/// Folds a dispute into the order; its state does not change.
pub(crate) fn evolve_disputed(order: &mut Order, event: &Event) {
    if let Event::Disputed {
        dispute_id,
        payment_id,
        amount_minor,
        reason,
        at,
    } = event
    {
        order.disputes.push(DisputeRef {
            dispute_id: dispute_id.clone(),
            payment_id: payment_id.clone(),
            amount_minor: *amount_minor,
            reason: reason.clone(),
            at: *at,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::{decide, fold, Command, PlaceOrder};
    use crate::{Money, PaidFact, Quantity, Sku};
    use uuid::Uuid;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("valid time")
    }

    /// A confirmed order settled on `pay_1`.
    fn confirmed() -> Vec<Event> {
        let brl = Money::new(2000, "BRL".parse().expect("currency")).expect("money");
        let mut events = decide(
            None,
            Command::Place(PlaceOrder {
                order_id: Uuid::nil(),
                account_id: Uuid::nil(),
                lines: vec![(
                    Sku::parse("A").expect("sku"),
                    Quantity::new(1).expect("quantity"),
                    brl,
                )],
                shipping: None,
                placed_at: t(0),
                expires_at: t(900),
            }),
        )
        .expect("placed");
        let paid = Command::Paid {
            fact: PaidFact {
                payment_id: "pay_1".into(),
                amount_minor: 2000,
                currency: "BRL".into(),
                captured: true,
                at: t(10),
            },
            units_gone: false,
            holdings: vec![],
        };
        events.extend(decide(fold(&events).as_ref(), paid).expect("confirmed"));
        events
    }

    fn dispute(id: &str, payment: &str) -> Command {
        Command::Dispute(DisputeFact {
            dispute_id: id.into(),
            payment_id: payment.into(),
            amount_minor: 2000,
            reason: "fraudulent".into(),
            at: t(20),
        })
    }

    #[test]
    fn a_dispute_is_recorded_once_and_leaves_the_state_alone() {
        let mut events = confirmed();
        let first = decide(fold(&events).as_ref(), dispute("dp_1", "pay_1")).expect("decided");
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].type_name(), "order.disputed.v1");
        assert_eq!(first[0].movement(), None);
        events.extend(first);
        let order = fold(&events).expect("order");
        assert_eq!(order.state, crate::OrderState::Confirmed);
        assert_eq!(order.disputes.len(), 1);
        assert_eq!(order.disputes[0].reason, "fraudulent");
        // A second report of the same dispute decides nothing; another dispute is recorded.
        assert_eq!(decide(Some(&order), dispute("dp_1", "pay_1")), Ok(vec![]));
        assert_eq!(
            decide(Some(&order), dispute("dp_2", "pay_1"))
                .expect("decided")
                .len(),
            1
        );
    }

    #[test]
    fn a_dispute_of_a_payment_the_order_does_not_name_is_refused() {
        let order = fold(&confirmed()).expect("order");
        assert_eq!(
            decide(Some(&order), dispute("dp_1", "pay_other")),
            Err(DomainError::NotDisputable("pay_other".into()))
        );
        let placed = fold(&confirmed()[..1]).expect("placed");
        assert!(decide(Some(&placed), dispute("dp_1", "pay_1")).is_err());
    }

    #[test]
    fn a_disputed_event_round_trips_through_its_stored_form() {
        let events =
            decide(fold(&confirmed()).as_ref(), dispute("dp_1", "pay_1")).expect("decided");
        let e = &events[0];
        assert_eq!(
            Event::from_parts(e.type_name(), e.data()).expect("parses"),
            *e
        );
    }
}
