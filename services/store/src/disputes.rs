//! Disputes (chargebacks) the PSP reports: recorded on the order that holds
//! the payment (`order.disputed`, once per dispute id), the order's shipment
//! held if it has not shipped, and a finding opened for a person — all in
//! the caller's transaction (the webhook's, with its receipt).
//!
//! The hold cannot race the warehouse: the order's row, then its shipment's
//! row, are locked before the shipment's state is read (the lock order of
//! every path), so a shipment that ships first is seen shipped and not held,
//! and [`crate::shipments::advance_due`] looks for holds again once it holds
//! its shipments' rows.

use crate::orders::{self, Transition};
use crate::StoreError;
use domain::{Command, DisputeFact, DomainError};
use events::Metadata;
use sqlx::PgConnection;
use uuid::Uuid;

/// A dispute as the PSP reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisputeReport {
    pub dispute_id: String,
    pub payment_id: String,
    pub amount_minor: i64,
    pub reason: String,
}

/// What became of a reported dispute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded on the order, a finding opened; `held`: its shipment had
    /// not shipped, and now waits for a person.
    New {
        order_id: Uuid,
        finding_id: i64,
        held: bool,
    },
    /// The order had this dispute already (a repeated or reordered report).
    AlreadyKnown(Uuid),
    /// No order of soldonce's holds the payment: nothing recorded.
    Foreign,
}

/// The order whose payment a dispute names, if soldonce recorded that payment.
async fn order_of(conn: &mut PgConnection, payment_id: &str) -> Result<Option<Uuid>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT order_id FROM payments WHERE payment_id = $1")
            .bind(payment_id)
            .fetch_optional(&mut *conn)
            .await?
            .flatten(),
    )
}

/// Records `report` in the caller's transaction, which the caller commits.
#[tracing::instrument(skip_all, fields(dispute_id = %report.dispute_id, payment_id = %report.payment_id))]
pub async fn record(
    conn: &mut PgConnection,
    report: &DisputeReport,
    meta: impl FnOnce(Uuid) -> Metadata,
) -> Result<Recorded, StoreError> {
    let Some(order_id) = order_of(conn, &report.payment_id).await? else {
        return Ok(Recorded::Foreign);
    };
    let fact = DisputeFact {
        dispute_id: report.dispute_id.clone(),
        payment_id: report.payment_id.clone(),
        amount_minor: report.amount_minor,
        reason: report.reason.clone(),
        at: crate::now(),
    };
    let order = match orders::transition_in(conn, order_id, None, &meta(order_id), |_| {
        Command::Dispute(fact)
    })
    .await?
    {
        Transition::Applied(order) => order,
        Transition::Unchanged(_) => return Ok(Recorded::AlreadyKnown(order_id)),
        Transition::NotFound | Transition::Refused(DomainError::NotDisputable(_)) => {
            return Ok(Recorded::Foreign)
        }
        other => {
            return Err(StoreError::Corrupt(format!(
                "order {order_id}: recording dispute {}: {other:?}",
                report.dispute_id
            )))
        }
    };
    let (held, shipment) = hold(conn, order_id, &report.dispute_id).await?;
    let detail = format!(
        "the buyer's bank took back {} {} of payment {} ({}); {}",
        report.amount_minor,
        order.currency,
        report.payment_id,
        report.reason,
        shipment_note(held, shipment.as_deref())
    );
    let finding_id =
        crate::findings::open(conn, "dispute", order_id, &report.dispute_id, &detail).await?;
    Ok(Recorded::New {
        order_id,
        finding_id,
        held,
    })
}

/// Holds `order_id`'s shipment for `cause` (a dispute's or a refund's id)
/// unless it has shipped, with the order's row already locked: the
/// shipment's row is locked next, as every path locks them. One hold per
/// cause: releasing another's leaves this one standing. Whether it is held,
/// and the shipment's state.
pub(crate) async fn hold(
    conn: &mut PgConnection,
    order_id: Uuid,
    cause: &str,
) -> Result<(bool, Option<String>), StoreError> {
    let shipment: Option<String> =
        sqlx::query_scalar("SELECT state FROM shipments WHERE order_id = $1 FOR UPDATE")
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await?;
    let held = matches!(shipment.as_deref(), None | Some("pending" | "picked"));
    if held {
        sqlx::query(
            "INSERT INTO shipment_holds (order_id, dispute_id) VALUES ($1, $2) \
             ON CONFLICT (order_id, dispute_id) DO NOTHING",
        )
        .bind(order_id)
        .bind(cause)
        .execute(&mut *conn)
        .await?;
    }
    Ok((held, shipment))
}

/// What a finding says of the order's shipment once [`hold`] ran.
pub(crate) fn shipment_note(held: bool, shipment: Option<&str>) -> &'static str {
    match shipment {
        _ if held => "its shipment is held until released (soldonce findings ack ID --release)",
        Some("shipped") => "the goods had shipped already",
        Some("delivered") => "the goods had been delivered already",
        Some(_) => "its shipment is past holding",
        None => "no shipment",
    }
}
