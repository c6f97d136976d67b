//! Learning what the payment provider says about a payment, from whichever
//! path hears it first: the worker's reply, a webhook, a lookup by key, or
//! reconciliation. Each fact commits, in the caller's transaction, with what
//! it decides: the order confirmed on the payment (`attached`), or a refund
//! of it recorded as a compensation (`refund`). The decision is made once;
//! the `payments` primary key serialises two deciders and a trigger keeps it
//! final, so no later fact can confirm on a refunded payment or the reverse.

use crate::orders::{self, Applied};
use crate::write::{self, Changes, Written};
use crate::StoreError;
use domain::{Command, Event, Order, PaidFact, PspStatus, RefundReason};
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// The payment id of a free order's settlement: no PSP holds it.
pub const FREE_PREFIX: &str = "free:";

/// Which path learned a fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Worker,
    Webhook,
    Lookup,
    Reconcile,
    /// A free order, settled without a PSP.
    Free,
}

impl Source {
    /// The column and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Worker => "worker",
            Source::Webhook => "webhook",
            Source::Lookup => "lookup",
            Source::Reconcile => "reconcile",
            Source::Free => "free",
        }
    }
}

/// What the PSP reported about one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFact {
    pub payment_id: String,
    /// The order the PSP's reference names, if it names one.
    pub order_id: Option<Uuid>,
    pub status: PspStatus,
    pub amount_minor: i64,
    pub currency: String,
    pub failure_reason: Option<String>,
}

/// What became of a fact.
#[derive(Debug, Clone, PartialEq)]
pub enum Learned {
    /// The order is confirmed on the payment (`reclaimed`: an expired order's units were taken back).
    Confirmed { order: Order, reclaimed: bool },
    /// The payment is to be refunded; the compensation is recorded.
    RefundDecided(RefundReason),
    /// A definite failure declined the order.
    Declined(Order),
    /// Nothing new: the payment's disposition was decided before, or the
    /// failure no longer applies.
    AlreadyKnown,
    /// Not a clear answer: ask the PSP again by key. Nothing was changed.
    Unknown(String),
}

/// Applies `fact` inside the caller's transaction, which the caller commits.
#[tracing::instrument(skip_all, fields(payment_id = %fact.payment_id, source = source.as_str()))]
pub async fn learn(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    source: Source,
    meta: &Metadata,
) -> Result<Learned, StoreError> {
    let at = crate::now();
    match &fact.status {
        PspStatus::Unknown(status) => Ok(Learned::Unknown(status.clone())),
        PspStatus::Failed => {
            let Some(order_id) = fact.order_id else {
                return Ok(Learned::AlreadyKnown);
            };
            let payment_id = Some(fact.payment_id.clone());
            let reason = fact
                .failure_reason
                .clone()
                .unwrap_or_else(|| "declined".into());
            let command = Command::FailPayment {
                payment_id,
                reason,
                at,
            };
            match orders::transition_in(conn, order_id, None, meta, |_| command).await? {
                orders::Transition::Applied(order) => Ok(Learned::Declined(order)),
                _ => Ok(Learned::AlreadyKnown),
            }
        }
        PspStatus::Succeeded => learn_success(conn, fact, source, meta, at, None).await,
    }
}

/// Applies several facts in the caller's transaction, in order; one
/// answer per fact. The orders they name are locked first, in id order (the
/// order every path locks orders in). The confirmations' events,
/// projections and stock movements are gathered and written together at
/// the end, on the write path: each SKU's row is moved once for the whole
/// batch, by the last statement, so a hot SKU is locked for as short a time
/// as possible. (A definite failure is rare: it is written as it comes.)
pub async fn learn_many(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
) -> Result<Vec<Learned>, StoreError> {
    let ids: Vec<Uuid> = facts.iter().filter_map(|(f, _, _)| f.order_id).collect();
    if ids.len() > 1 {
        orders::lock_in_id_order(conn, &ids).await?;
    }
    let at = crate::now();
    let mut changes = Changes::new();
    let mut learned = Vec::with_capacity(facts.len());
    for (fact, source, meta) in facts {
        learned.push(match &fact.status {
            PspStatus::Succeeded => {
                learn_success(conn, fact, *source, meta, at, Some(&mut changes)).await?
            }
            _ => learn(conn, fact, *source, meta).await?,
        });
    }
    if let Written::StockShort(sku) = write::commit(conn, &changes).await? {
        return Err(StoreError::Corrupt(format!(
            "confirming a batch of payments found {sku} short"
        )));
    }
    Ok(learned)
}

/// Learns a successful payment; with `batch`, its order's changes join the
/// batch's (written by the caller) instead of being written now.
async fn learn_success(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    source: Source,
    meta: &Metadata,
    at: chrono::DateTime<chrono::Utc>,
    batch: Option<&mut Changes>,
) -> Result<Learned, StoreError> {
    // Lock order: the order row, then the payment row, on every path.
    let order = match fact.order_id {
        Some(id) => orders::load_locked(conn, id, None).await?,
        None => None,
    };
    let known: Option<(String,)> =
        sqlx::query_as("SELECT disposition FROM payments WHERE payment_id = $1 FOR UPDATE")
            .bind(&fact.payment_id)
            .fetch_optional(&mut *conn)
            .await?;
    if known.is_some() {
        return Ok(Learned::AlreadyKnown);
    }
    let Some(order) = order else {
        let recorded = record(
            conn,
            fact,
            None,
            Disposition::Refund(RefundReason::NoSuchOrder),
            source,
        )
        .await?;
        return Ok(if recorded {
            Learned::RefundDecided(RefundReason::NoSuchOrder)
        } else {
            Learned::AlreadyKnown
        });
    };
    let paid = |units_gone| Command::Paid {
        fact: PaidFact {
            payment_id: fact.payment_id.clone(),
            amount_minor: fact.amount_minor,
            currency: fact.currency.clone(),
            at,
        },
        units_gone,
    };
    // An expired order takes its units back only if they are still there:
    // a fact the store supplies (under the stock rows' locks), the domain decides.
    let units_gone =
        order.payment_would_reclaim() && !crate::stock::covers(conn, &order.lines).await?;
    let events = decide(&order, paid(units_gone))?;
    if events.is_empty() {
        return Ok(Learned::AlreadyKnown);
    }
    let next = match batch {
        Some(changes) => changes.order(Some(&order), &events, meta)?,
        None => match orders::apply(conn, &order, &events, meta).await? {
            Applied::Done(next) => *next,
            Applied::StockShort(sku) => {
                return Err(StoreError::Corrupt(format!(
                    "order {}: confirming found {sku} short",
                    order.id
                )))
            }
        },
    };
    let (disposition, learned) = match &events[..] {
        [Event::Confirmed { reactivated, .. }] => (
            Disposition::Attached,
            Learned::Confirmed {
                order: next,
                reclaimed: *reactivated,
            },
        ),
        [Event::RefundDecided { reason, .. }] => (
            Disposition::Refund(*reason),
            Learned::RefundDecided(*reason),
        ),
        other => return Err(StoreError::Corrupt(format!("a payment decided {other:?}"))),
    };
    if !record(conn, fact, Some(order.id), disposition, source).await? {
        return Err(StoreError::Conflict(order.id));
    }
    Ok(learned)
}

fn decide(order: &Order, command: Command) -> Result<Vec<Event>, StoreError> {
    domain::decide(Some(order), command)
        .map_err(|e| StoreError::Corrupt(format!("order {}: {e}", order.id)))
}

enum Disposition {
    Attached,
    Refund(RefundReason),
}

/// Inserts the payment's one row; `false` if another decider got there first.
async fn record(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    order_id: Option<Uuid>,
    disposition: Disposition,
    source: Source,
) -> Result<bool, StoreError> {
    let (disposition, reason, refund_state) = match disposition {
        Disposition::Attached => ("attached", None, None),
        Disposition::Refund(reason) => ("refund", Some(reason.as_str()), Some("pending")),
    };
    let inserted = sqlx::query(
        "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, reason, learned_from, refund_state, next_attempt_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $8 IS NULL THEN NULL ELSE now() END) ON CONFLICT DO NOTHING",
    )
    .bind(&fact.payment_id)
    .bind(order_id)
    .bind(fact.amount_minor)
    .bind(&fact.currency)
    .bind(disposition)
    .bind(reason)
    .bind(source.as_str())
    .bind(refund_state)
    .execute(&mut *conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Whether a payment is already recorded (attached to its order, or owed a
/// refund). A recorded payment's disposition is final, so every later report
/// of its success is already known; a plain read, no lock.
pub async fn is_known(pool: &PgPool, payment_id: &str) -> Result<bool, StoreError> {
    let known: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM payments WHERE payment_id = $1)")
            .bind(payment_id)
            .fetch_one(pool)
            .await?;
    Ok(known)
}

/// Records a webhook id; `false` if it was seen before (then do nothing).
pub async fn record_webhook(
    conn: &mut PgConnection,
    webhook_id: &str,
    event_type: &str,
    order_id: Option<Uuid>,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO webhook_receipts (webhook_id, event_type, order_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(webhook_id)
    .bind(event_type)
    .bind(order_id)
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}
