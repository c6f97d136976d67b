//! Learning what the payment provider says about a payment, from whichever
//! path hears it first: the worker's reply, a webhook, a lookup by key, or
//! reconciliation. Each fact commits, in the caller's transaction, with what
//! it decides: the order confirmed on the payment (`attached`), or a refund
//! of it recorded as a compensation (`refund`). The decision is made once;
//! the `payments` primary key serialises two deciders and a trigger keeps it
//! final, so no later fact can confirm on a refunded payment or the reverse.
//!
//! Layout:
//! - `mod.rs` — the facts learned, one or a batch, each decided against its order
//! - `fact.rs` — what the PSP reported, which path heard it, what became of it
//! - `rows.rs` — the `payments` rows a batch records
//! - `receipts.rs` — what the webhook path asks first: payments already recorded, webhook ids seen
//! - `extension.rs` — how long a buyer's 3-D Secure action extends a reservation

use crate::orders::{self, Waiting};
use crate::statement::{Statement, Written};
use crate::write::Changes;
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Command, Event, Order, PaidFact, PspStatus};
use events::Metadata;
use sqlx::PgConnection;
use std::collections::{HashMap, HashSet};
use uuid::Uuid;

mod extension;
mod fact;
mod receipts;
mod rows;

pub use extension::{action_extension_setting, set_action_extension};
pub use fact::{Learned, PaymentFact, Source};
pub use receipts::{known_among, record_webhook};

use extension::action_extension;
use rows::{Disposition, NewPayments};

/// The payment id of a free order's settlement: no PSP holds it.
pub const FREE_PREFIX: &str = "free:";
/// What the idempotency key of every charge soldonce makes starts with (`pay:<order_id>`).
pub const PAY_KEY_PREFIX: &str = "pay:";

/// The order a PSP payment was made for, if soldonce made it: its
/// idempotency key is `pay:<order_id>` and its reference that same order id.
/// A shared PSP account also holds payments soldonce never made (a shop's
/// point of sale, another system, another soldonce); their references may
/// look like order ids, even name one of ours, so the reference alone
/// proves nothing. The store then also requires the order to exist.
pub fn own_order(reference: Option<&str>, idempotency_key: Option<&str>) -> Option<Uuid> {
    let order: Uuid = reference?.parse().ok()?;
    let key_names = idempotency_key?
        .strip_prefix(PAY_KEY_PREFIX)?
        .parse::<Uuid>()
        .ok()?;
    (key_names == order).then_some(order)
}

/// Applies `fact` inside the caller's transaction, which the caller commits.
#[tracing::instrument(skip_all, fields(payment_id = %fact.payment_id, source = source.as_str()))]
pub async fn learn(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    source: Source,
    meta: &Metadata,
) -> Result<Learned, StoreError> {
    learn_one(conn, fact, source, meta, Waiting::Wait).await
}

/// [`learn`], unless another writer is deciding the fact's order right now
/// (its row is locked): then `StoreError::Busy` at once, with nothing
/// written, instead of queueing behind that writer. For a source that can
/// ask to be told again later — a webhook answered `503` is redelivered —
/// so that it never holds up the payment worker's batch, nor the consumers
/// queued behind it, while the worker records the same payment.
#[tracing::instrument(skip_all, fields(payment_id = %fact.payment_id, source = source.as_str()))]
pub async fn learn_unless_busy(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    source: Source,
    meta: &Metadata,
) -> Result<Learned, StoreError> {
    learn_one(conn, fact, source, meta, Waiting::NoWait).await
}

async fn learn_one(
    conn: &mut PgConnection,
    fact: &PaymentFact,
    source: Source,
    meta: &Metadata,
    waiting: Waiting,
) -> Result<Learned, StoreError> {
    let batch = [(fact.clone(), source, meta.clone())];
    let mut learned = learn_many_waiting(conn, &batch, waiting).await?;
    learned
        .pop()
        .ok_or_else(|| StoreError::Corrupt("learning a payment answered nothing".into()))
}

/// Applies several facts in the caller's transaction, in order; one
/// answer per fact. Set-based whatever the batch's size: the orders the
/// facts name are loaded and locked in one statement, in id order (the
/// order every path locks orders in), then the payments already recorded
/// (lock order: orders, then payments, on every path). Each fact is decided
/// against the order as the facts before it in the batch left it, so two
/// facts about one order (a redelivery, a decline after a success) agree.
/// The payments are inserted in one statement, and the events, projections
/// and stock movements written together last, on the write path: each SKU's
/// row is moved once for the whole batch, by the last statement, so a hot
/// SKU is locked for as short a time as possible.
pub async fn learn_many(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
) -> Result<Vec<Learned>, StoreError> {
    learn_many_waiting(conn, facts, Waiting::Wait).await
}

/// Locks the payments already recorded among a batch's successes, in
/// payment id order. The statement runs inside a function that plans it at
/// every call on the table as it is then (migration
/// `planned_at_each_call`): prepared, PostgreSQL kept a generic plan made
/// while the payments table was nearly empty (a new system, or a
/// benchmark's first seconds), and that plan read every payment at each
/// call, comparing each with each id of the batch, as the table grew (seen
/// under `auto_explain`: 1,100–1,650 rows read to find none, 115 blocks a
/// call on average over a 15,000-order run). Run unprepared instead, it
/// would cost a second round trip at every call.
pub const LOCK_KNOWN_SQL: &str = "SELECT * FROM payments_recorded_locking($1)";

async fn learn_many_waiting(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
    waiting: Waiting,
) -> Result<Vec<Learned>, StoreError> {
    let orders = lock_orders(conn, facts, waiting).await?;
    let known = lock_known(conn, facts).await?;
    lock_reviving_accounts(conn, facts, &orders).await?;
    let mut locked = Locked { orders, known };
    let mut decided = Decided {
        at: crate::now(),
        changes: Changes::new(),
        payments: NewPayments::default(),
    };
    let mut learned = Vec::with_capacity(facts.len());
    for (fact, source, meta) in facts {
        let answer = learn_fact(conn, &mut locked, &mut decided, fact, *source, meta).await?;
        learned.push(answer);
    }
    write_batch(conn, facts, decided, learned).await
}

/// What a batch holds while it decides: the orders its facts name, as the
/// facts decided so far left them, and the payments already recorded.
struct Locked {
    orders: HashMap<Uuid, Order>,
    known: HashSet<String>,
}

/// What a batch decides, gathered to be written in one statement at its end.
struct Decided<'a> {
    /// When the batch decides: the time every command of it carries.
    at: DateTime<Utc>,
    changes: Changes,
    payments: NewPayments<'a>,
}

/// The orders a batch's facts name, loaded and locked in one statement, in
/// id order (the order every path locks orders in).
async fn lock_orders(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
    waiting: Waiting,
) -> Result<HashMap<Uuid, Order>, StoreError> {
    let mut ids: Vec<Uuid> = facts.iter().filter_map(|(f, _, _)| f.order_id).collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(orders::load_many_locking(conn, &ids, waiting)
        .await?
        .into_iter()
        .map(|o| (o.id, o))
        .collect())
}

/// The payments already recorded among a batch's reports that can settle
/// or void one, locked after the orders (the lock order of every path).
async fn lock_known(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
) -> Result<HashSet<String>, StoreError> {
    // Successes and authorizations, and failures too: a `canceled` report
    // of a payment already recorded is soldonce's own void coming back.
    let successes: Vec<&str> = facts
        .iter()
        .filter(|(f, _, _)| f.status.is_paid() || f.status == PspStatus::Failed)
        .map(|(f, _, _)| f.payment_id.as_str())
        .collect();
    Ok(if successes.is_empty() {
        HashSet::new()
    } else {
        sqlx::query_scalar(LOCK_KNOWN_SQL)
            .bind(&successes)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect()
    })
}

/// Takes the placing locks of the accounts whose expired orders a payment
/// in the batch would revive.
async fn lock_reviving_accounts(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
    orders: &HashMap<Uuid, Order>,
) -> Result<(), StoreError> {
    // A revival (a late payment of an expired order) is held to its
    // account's limits: the accounts' placing locks first, in account
    // order as placing takes them, before any stock row's.
    let mut reviving: Vec<Uuid> = facts
        .iter()
        .filter(|(f, _, _)| f.status.is_paid())
        .filter_map(|(f, _, _)| orders.get(&f.order_id?))
        .filter(|o| o.payment_would_reclaim())
        .map(|o| o.account_id)
        .collect();
    reviving.sort_unstable();
    reviving.dedup();
    crate::placing::lock_accounts(conn, &reviving).await
}

/// One fact's answer, decided against its order as the facts before it in
/// the batch left it; what it changes joins `decided`.
async fn learn_fact<'a>(
    conn: &mut PgConnection,
    locked: &mut Locked,
    decided: &mut Decided<'a>,
    fact: &'a PaymentFact,
    source: Source,
    meta: &Metadata,
) -> Result<Learned, StoreError> {
    let order = fact.order_id.and_then(|id| locked.orders.get(&id));
    let (answer, next) = match &fact.status {
        PspStatus::Unknown(status) => (Learned::Unknown(status.clone()), None),
        PspStatus::ActionRequired => match order {
            Some(order) => (
                Learned::AwaitingAction,
                await_action(order, fact, meta, decided)?,
            ),
            None => (Learned::Foreign, None),
        },
        // Its disposition is decided: an authorization attached to a
        // confirmed order that lapsed, or one soldonce voided itself.
        PspStatus::Failed if locked.known.contains(&fact.payment_id) => {
            (Learned::AlreadyKnown, None)
        }
        PspStatus::Failed => match order {
            Some(order) => decline(order, fact, meta, decided)?,
            None => (Learned::Foreign, None),
        },
        PspStatus::Succeeded | PspStatus::Authorized if order.is_none() => (Learned::Foreign, None),
        PspStatus::Succeeded | PspStatus::Authorized
            if !locked.known.insert(fact.payment_id.clone()) =>
        {
            (Learned::AlreadyKnown, None)
        }
        PspStatus::Succeeded | PspStatus::Authorized => match order {
            None => (Learned::Foreign, None),
            Some(order) => settle(conn, order, fact, source, meta, decided).await?,
        },
    };
    if let Some(next) = next {
        locked.orders.insert(next.id, next);
    }
    Ok(answer)
}

/// A payment waiting on the buyer's action (3-D Secure): its order's
/// reservation extended. The order after, if it changed.
fn await_action(
    order: &Order,
    fact: &PaymentFact,
    meta: &Metadata,
    decided: &mut Decided<'_>,
) -> Result<Option<Order>, StoreError> {
    let command = Command::AwaitAction {
        payment_id: fact.payment_id.clone(),
        url: fact.next_action_url.clone().unwrap_or_default(),
        extension: action_extension(),
        at: decided.at,
    };
    let events = decide(order, command)?;
    if events.is_empty() {
        return Ok(None);
    }
    Ok(Some(decided.changes.order(Some(order), &events, meta)?))
}

/// A declined (or voided) payment: its order's payment failed, unless the
/// order already knows. The answer, and the order after if it changed.
fn decline(
    order: &Order,
    fact: &PaymentFact,
    meta: &Metadata,
    decided: &mut Decided<'_>,
) -> Result<(Learned, Option<Order>), StoreError> {
    let command = Command::FailPayment {
        payment_id: Some(fact.payment_id.clone()),
        abandoned: fact.abandoned,
        reason: fact
            .failure_reason
            .clone()
            .unwrap_or_else(|| "declined".into()),
        at: decided.at,
    };
    match domain::decide(Some(order), command) {
        Ok(events) if !events.is_empty() => {
            let next = decided.changes.order(Some(order), &events, meta)?;
            Ok((Learned::Declined(next.clone()), Some(next)))
        }
        _ => Ok((Learned::AlreadyKnown, None)),
    }
}

/// A success or authorization not recorded before: its order confirmed on
/// it, or a refund of it owed, with its payment row to insert. The answer,
/// and the order after if it changed.
async fn settle<'a>(
    conn: &mut PgConnection,
    order: &Order,
    fact: &'a PaymentFact,
    source: Source,
    meta: &Metadata,
    decided: &mut Decided<'a>,
) -> Result<(Learned, Option<Order>), StoreError> {
    let at = decided.at;
    let paid = |units_gone, holdings| Command::Paid {
        fact: PaidFact {
            payment_id: fact.payment_id.clone(),
            amount_minor: fact.amount_minor,
            currency: fact.currency.clone(),
            captured: fact.status == PspStatus::Succeeded,
            at,
        },
        units_gone,
        holdings,
    };
    // An expired order takes its units back only if they are still there
    // and its account may hold them: facts the store supplies (under the
    // stock rows' and the account's locks), the domain decides.
    let revival = order.payment_would_reclaim();
    let units_gone = revival && !crate::stock::covers(conn, &order.lines).await?;
    let holdings = if revival && !units_gone {
        crate::placing::holdings(conn, order).await?
    } else {
        vec![]
    };
    let events = decide(order, paid(units_gone, holdings))?;
    // A free order's settlement took no money: if it can no longer settle
    // its order (cancelled meanwhile), there is nothing to give back.
    let free_unsettled = fact.payment_id.starts_with(FREE_PREFIX)
        && matches!(events[..], [Event::RefundDecided { .. }]);
    if events.is_empty() || free_unsettled {
        return Ok((Learned::AlreadyKnown, None));
    }
    let next = decided.changes.order(Some(order), &events, meta)?;
    let (disposition, answer) = match &events[..] {
        [Event::Confirmed { reactivated, .. }] => (
            Disposition::Attached,
            Learned::Confirmed {
                order: next.clone(),
                reclaimed: *reactivated,
            },
        ),
        [Event::RefundDecided { reason, void, .. }] => (
            Disposition::Refund(*reason, *void),
            Learned::RefundDecided(*reason),
        ),
        other => return Err(StoreError::Corrupt(format!("a payment decided {other:?}"))),
    };
    decided
        .payments
        .push(fact, Some(next.id), disposition, source);
    Ok((answer, Some(next)))
}

/// Writes what a batch decided in one statement: the payments, then the
/// orders on the write path (stock last). A payment another decider
/// recorded meanwhile makes its answer already known, or its order a conflict.
async fn write_batch(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
    decided: Decided<'_>,
    mut learned: Vec<Learned>,
) -> Result<Vec<Learned>, StoreError> {
    // The payments, then the orders on the write path (stock last), in one statement.
    let mut statement = Statement::new();
    let inserted = decided.payments.insert_into(&mut statement)?;
    decided.changes.add_to(&mut statement)?;
    let (written, returned) = statement.run_returning(conn).await?;
    // Another decider may have recorded a payment since it was looked up
    // (only one naming no order: the others wait on their order's lock).
    let lost = decided
        .payments
        .lost(inserted.and_then(|i| returned.get(i)));
    for (i, (fact, _, _)) in facts.iter().enumerate() {
        if !lost.contains(fact.payment_id.as_str()) {
            continue;
        }
        match fact.order_id {
            None => learned[i] = Learned::AlreadyKnown,
            Some(id) => return Err(StoreError::Conflict(id)),
        }
    }
    if let Written::StockShort(sku) = written {
        return Err(StoreError::Corrupt(format!(
            "confirming a batch of payments found {sku} short"
        )));
    }
    Ok(learned)
}

fn decide(order: &Order, command: Command) -> Result<Vec<Event>, StoreError> {
    domain::decide(Some(order), command)
        .map_err(|e| StoreError::Corrupt(format!("order {}: {e}", order.id)))
}
