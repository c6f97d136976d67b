//! Refunds of an order's payment that soldonce did not make — at the PSP's
//! dashboard, by another system on a shared account — reported by the
//! PSP's `refund.succeeded`. Money went back without soldonce, so like a
//! dispute it is recorded on the order (`order.refunded_elsewhere`, once
//! per refund id), the order's shipment is held if it has not shipped, and
//! a finding is opened for a person; all in the caller's transaction.
//!
//! A refund is soldonce's own when an operator refund of that payment
//! carries its id, or is still pending for its amount (the PSP's webhook
//! can arrive before the payment worker records the PSP's answer).
//! Refunds of payments soldonce is compensating complete that compensation
//! instead (`compensations`).

use crate::orders::{self, Transition};
use crate::StoreError;
use domain::Command;
use events::Metadata;
use sqlx::PgConnection;
use uuid::Uuid;

/// What became of a reported refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded on the order, a finding opened; `held`: its shipment had
    /// not shipped, and now waits for a person.
    New {
        order_id: Uuid,
        finding_id: i64,
        held: bool,
    },
    /// Recorded before (a repeated report).
    AlreadyKnown(Uuid),
    /// One of soldonce's own operator refunds.
    Ours,
    /// No confirmed order of soldonce's stands on the payment.
    NotAttached,
}

/// Records a refund `refund_id` of `amount_minor` of `payment_id`, in the
/// caller's transaction, which the caller commits.
#[tracing::instrument(skip_all, fields(refund_id, payment_id))]
pub async fn record(
    conn: &mut PgConnection,
    payment_id: &str,
    refund_id: &str,
    amount_minor: i64,
    meta: impl FnOnce(Uuid) -> Metadata,
) -> Result<Recorded, StoreError> {
    let order_id: Option<Option<Uuid>> = sqlx::query_scalar(
        "SELECT order_id FROM payments WHERE payment_id = $1 AND disposition = 'attached'",
    )
    .bind(payment_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(Some(order_id)) = order_id else {
        return Ok(Recorded::NotAttached);
    };
    // The order's row first, as every path locks it: an operator refund of
    // it is decided and recorded under the same lock.
    if orders::load_locked(conn, order_id, None).await?.is_none() {
        return Ok(Recorded::NotAttached);
    }
    let (ours, known): (bool, bool) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM operator_refunds r WHERE r.order_id = $1 AND r.payment_id = $2 AND NOT r.void \
                        AND (r.refund_id = $3 OR (r.state = 'pending' AND r.amount_minor = $4))), \
                EXISTS (SELECT 1 FROM findings f WHERE f.kind = 'refund_elsewhere' AND f.subject = $3)",
    )
    .bind(order_id)
    .bind(payment_id)
    .bind(refund_id)
    .bind(amount_minor)
    .fetch_one(&mut *conn)
    .await?;
    if ours {
        return Ok(Recorded::Ours);
    }
    if known {
        return Ok(Recorded::AlreadyKnown(order_id));
    }
    let command = Command::RecordRefundElsewhere {
        refund_id: refund_id.to_owned(),
        payment_id: payment_id.to_owned(),
        amount_minor,
        at: crate::now(),
    };
    let order =
        match orders::transition_in(conn, order_id, None, &meta(order_id), |_| command).await? {
            Transition::Applied(order) => order,
            Transition::Refused(_) | Transition::NotFound | Transition::Unchanged(_) => {
                return Ok(Recorded::NotAttached)
            }
            Transition::StockShort(sku) => {
                return Err(StoreError::Corrupt(format!(
                    "order {order_id}: a refund moved stock of {sku}"
                )))
            }
        };
    let (held, shipment) = crate::disputes::hold(conn, order_id, refund_id).await?;
    let detail = format!(
        "{amount_minor} {} of payment {payment_id} was refunded outside soldonce (refund {refund_id}); {}",
        order.currency,
        crate::disputes::shipment_note(held, shipment.as_deref())
    );
    let finding_id =
        crate::findings::open(conn, "refund_elsewhere", order_id, refund_id, &detail).await?;
    Ok(Recorded::New {
        order_id,
        finding_id,
        held,
    })
}
