//! 3-D Secure: a payment the PSP answers `requires_action` waits for the
//! buyer. The order stays `payment_pending`, shows where the buyer must go
//! (`next_action.url`), and its reservation is extended once — by the
//! action extension, never past a bound — so a buyer mid-challenge does not
//! lose the units. If the buyer never finishes, or abandons the challenge
//! (the PSP cancels the payment, reason `abandoned`), the order expires as
//! any unpaid one; an authorization that lands later is voided or reclaims
//! the units like any late payment.

use crate::event::Event;
pub use crate::state::NextAction;
use crate::state::{Order, OrderState};
use chrono::{DateTime, Duration, Utc};

/// The longest a reservation may be extended for a buyer's action.
pub const MAX_EXTENSION: Duration = Duration::hours(1);

/// Decides that the order waits for the buyer's action on `payment_id`:
/// once per order (the first challenge extends the reservation; a repeat,
/// or a second payment's, extends nothing).
pub(crate) fn decide_await(
    order: &Order,
    payment_id: &str,
    url: &str,
    extension: Duration,
    at: DateTime<Utc>,
) -> Vec<Event> {
    if order.state != OrderState::PaymentPending || order.next_action.is_some() {
        return vec![];
    }
    let extension = extension.clamp(Duration::zero(), MAX_EXTENSION);
    vec![Event::ActionRequired {
        payment_id: payment_id.to_owned(),
        url: url.chars().take(2048).collect(),
        expires_at: order.expires_at.max(at + extension),
        at,
    }]
}

/// Whether the order waits for the buyer's action on `payment_id`.
pub(crate) fn awaits(order: &Order, payment_id: &str) -> bool {
    order.state == OrderState::PaymentPending
        && order
            .next_action
            .as_ref()
            .is_some_and(|a| a.payment_id == payment_id)
}

/// Folds `order.action_required` into the order.
pub(crate) fn evolve(order: &mut Order, event: &Event) {
    if let Event::ActionRequired {
        payment_id,
        url,
        expires_at,
        ..
    } = event
    {
        order.next_action = Some(NextAction {
            payment_id: payment_id.clone(),
            url: url.clone(),
        });
        order.expires_at = *expires_at;
    }
}
