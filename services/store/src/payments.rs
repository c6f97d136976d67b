//! Learning what the payment provider says about a payment, from whichever
//! path hears it first: the worker's reply, a webhook, a lookup by key, or
//! reconciliation. Each fact commits, in the caller's transaction, with what
//! it decides: the order confirmed on the payment (`attached`), or a refund
//! of it recorded as a compensation (`refund`). The decision is made once;
//! the `payments` primary key serialises two deciders and a trigger keeps it
//! final, so no later fact can confirm on a refunded payment or the reverse.

use crate::orders::{self, Waiting};
use crate::write::{Changes, Statement, Written};
use crate::StoreError;
use domain::{Command, Event, Order, PaidFact, PspStatus, RefundReason};
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use std::collections::{HashMap, HashSet};
use uuid::Uuid;

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

/// How long a reservation is extended, once, for a buyer's 3-D Secure
/// action: `ACTION_EXTENSION` as the service read it at start (10 minutes
/// unless set; at most [`domain::action::MAX_EXTENSION`]).
static ACTION_EXTENSION: std::sync::OnceLock<chrono::Duration> = std::sync::OnceLock::new();

/// Reads `ACTION_EXTENSION` (default 10 minutes, at most an hour): the
/// payment worker and checkout both learn of buyers' challenges, so both
/// read it alike.
pub fn action_extension_setting() -> Result<std::time::Duration, platform::config::ConfigError> {
    let setting = platform::config::var(
        "ACTION_EXTENSION",
        "how much longer a reservation lasts, once, while the buyer completes a 3-D Secure challenge (at most 1h)",
    );
    let d = setting.duration(std::time::Duration::from_secs(600))?;
    if d > std::time::Duration::from_secs(3600) {
        return Err(platform::config::ConfigError::new(
            setting.name(),
            "must be at most 1h",
        ));
    }
    Ok(d)
}

/// Sets the action extension for this process (once, at start).
pub fn set_action_extension(extension: std::time::Duration) {
    let extension = chrono::Duration::from_std(extension)
        .unwrap_or(domain::action::MAX_EXTENSION)
        .min(domain::action::MAX_EXTENSION);
    let _ = ACTION_EXTENSION.set(extension);
}

fn action_extension() -> chrono::Duration {
    *ACTION_EXTENSION.get_or_init(|| chrono::Duration::minutes(10))
}

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
    /// The order soldonce made the payment for ([`own_order`]); `None` for
    /// a payment soldonce did not make.
    pub order_id: Option<Uuid>,
    pub status: PspStatus,
    pub amount_minor: i64,
    pub currency: String,
    pub failure_reason: Option<String>,
    /// The buyer left the payment's 3-D Secure challenge unfinished (the
    /// PSP canceled it, reason `abandoned`): its order expires.
    pub abandoned: bool,
    /// Where the buyer must act, for a payment that `requires_action`.
    pub next_action_url: Option<String>,
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
    /// Nothing new: the payment's disposition was decided before, the
    /// failure no longer applies, or a free order's settlement came after
    /// its order ended (no money to give back).
    AlreadyKnown,
    /// Not a clear answer: ask the PSP again by key. Nothing was changed.
    Unknown(String),
    /// The payment waits for the buyer's action (3-D Secure); the order
    /// waits with it (its reservation extended once, if this is news).
    AwaitingAction,
    /// Not soldonce's payment: made without its key, or for an order it
    /// does not hold. Nothing was recorded; it is never refunded.
    Foreign,
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

/// Locks the payments already recorded among a batch's successes. It runs
/// unprepared, planned at each call on the table as it is then: prepared,
/// PostgreSQL kept a generic plan made while the payments table was nearly
/// empty (a new system, or a benchmark's first seconds), and that plan read
/// every payment at each call, comparing each with each id of the batch, as
/// the table grew (seen under `auto_explain`: 1,100–1,650 rows read to find
/// none, 115 blocks a call on average over a 15,000-order run).
pub const LOCK_KNOWN_SQL: &str =
    "SELECT payment_id FROM payments WHERE payment_id = ANY($1) ORDER BY payment_id FOR UPDATE";

async fn learn_many_waiting(
    conn: &mut PgConnection,
    facts: &[(PaymentFact, Source, Metadata)],
    waiting: Waiting,
) -> Result<Vec<Learned>, StoreError> {
    let mut ids: Vec<Uuid> = facts.iter().filter_map(|(f, _, _)| f.order_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut orders: HashMap<Uuid, Order> = orders::load_many_locking(conn, &ids, waiting)
        .await?
        .into_iter()
        .map(|o| (o.id, o))
        .collect();
    // Successes and authorizations, and failures too: a `canceled` report
    // of a payment already recorded is soldonce's own void coming back.
    let successes: Vec<&str> = facts
        .iter()
        .filter(|(f, _, _)| f.status.is_paid() || f.status == PspStatus::Failed)
        .map(|(f, _, _)| f.payment_id.as_str())
        .collect();
    let mut known: HashSet<String> = if successes.is_empty() {
        HashSet::new()
    } else {
        // Unprepared: planned at each call on the table's size then (see
        // [`LOCK_KNOWN_SQL`]).
        sqlx::query_scalar(LOCK_KNOWN_SQL)
            .persistent(false)
            .bind(&successes)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect()
    };
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
    crate::placing::lock_accounts(conn, &reviving).await?;
    let at = crate::now();
    let mut changes = Changes::new();
    let mut payments = NewPayments::default();
    let mut learned = Vec::with_capacity(facts.len());
    for (fact, source, meta) in facts {
        let order = fact.order_id.and_then(|id| orders.get(&id));
        let answer = match &fact.status {
            PspStatus::Unknown(status) => Learned::Unknown(status.clone()),
            PspStatus::ActionRequired => match order {
                Some(order) => {
                    let command = Command::AwaitAction {
                        payment_id: fact.payment_id.clone(),
                        url: fact.next_action_url.clone().unwrap_or_default(),
                        extension: action_extension(),
                        at,
                    };
                    let events = decide(order, command)?;
                    if !events.is_empty() {
                        let next = changes.order(Some(order), &events, meta)?;
                        orders.insert(next.id, next);
                    }
                    Learned::AwaitingAction
                }
                None => Learned::Foreign,
            },
            // Its disposition is decided: an authorization attached to a
            // confirmed order that lapsed, or one soldonce voided itself.
            PspStatus::Failed if known.contains(&fact.payment_id) => Learned::AlreadyKnown,
            PspStatus::Failed => match order {
                Some(order) => {
                    let command = Command::FailPayment {
                        payment_id: Some(fact.payment_id.clone()),
                        abandoned: fact.abandoned,
                        reason: fact
                            .failure_reason
                            .clone()
                            .unwrap_or_else(|| "declined".into()),
                        at,
                    };
                    match domain::decide(Some(order), command) {
                        Ok(events) if !events.is_empty() => {
                            let next = changes.order(Some(order), &events, meta)?;
                            orders.insert(next.id, next.clone());
                            Learned::Declined(next)
                        }
                        _ => Learned::AlreadyKnown,
                    }
                }
                None => Learned::Foreign,
            },
            PspStatus::Succeeded | PspStatus::Authorized if order.is_none() => Learned::Foreign,
            PspStatus::Succeeded | PspStatus::Authorized
                if !known.insert(fact.payment_id.clone()) =>
            {
                Learned::AlreadyKnown
            }
            PspStatus::Succeeded | PspStatus::Authorized => match order {
                None => Learned::Foreign,
                Some(order) => {
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
                        Learned::AlreadyKnown
                    } else {
                        let next = changes.order(Some(order), &events, meta)?;
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
                            other => {
                                return Err(StoreError::Corrupt(format!(
                                    "a payment decided {other:?}"
                                )))
                            }
                        };
                        payments.push(fact, Some(next.id), disposition, *source);
                        orders.insert(next.id, next);
                        answer
                    }
                }
            },
        };
        learned.push(answer);
    }
    // The payments, then the orders on the write path (stock last), in one statement.
    let mut statement = Statement::new();
    let inserted = payments.insert_into(&mut statement)?;
    changes.add_to(&mut statement)?;
    let (written, returned) = statement.run_returning(conn).await?;
    // Another decider may have recorded a payment since it was looked up
    // (only one naming no order: the others wait on their order's lock).
    let lost = payments.lost(inserted.and_then(|i| returned.get(i)));
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

enum Disposition {
    Attached,
    /// Refunded, or voided (`true`) when only authorized.
    Refund(RefundReason, bool),
}

/// Payments to record, one row each, inserted in one statement.
#[derive(Default)]
struct NewPayments<'a> {
    ids: Vec<&'a str>,
    orders: Vec<Option<Uuid>>,
    amounts: Vec<i64>,
    currencies: Vec<&'a str>,
    dispositions: Vec<&'static str>,
    reasons: Vec<Option<&'static str>>,
    sources: Vec<&'static str>,
    methods: Vec<&'static str>,
}

impl<'a> NewPayments<'a> {
    fn push(
        &mut self,
        fact: &'a PaymentFact,
        order_id: Option<Uuid>,
        disposition: Disposition,
        source: Source,
    ) {
        let (disposition, reason, method) = match disposition {
            Disposition::Attached => ("attached", None, "refund"),
            Disposition::Refund(reason, void) => (
                "refund",
                Some(reason.as_str()),
                if void { "void" } else { "refund" },
            ),
        };
        self.ids.push(&fact.payment_id);
        self.orders.push(order_id);
        self.amounts.push(fact.amount_minor);
        self.currencies.push(&fact.currency);
        self.dispositions.push(disposition);
        self.reasons.push(reason);
        self.sources.push(source.as_str());
        self.methods.push(method);
    }

    /// Inserts the rows, as the first fragment of `statement`; returns the
    /// index of what it returns ([`Statement::returning`]), `None` when there
    /// is nothing to insert.
    fn insert_into<'q>(
        &'q self,
        statement: &mut Statement<'q>,
    ) -> Result<Option<usize>, StoreError> {
        if self.ids.is_empty() {
            return Ok(None);
        }
        let s = statement;
        let (ids, orders, amounts) = (
            s.bind(&self.ids)?,
            s.bind(&self.orders)?,
            s.bind(&self.amounts)?,
        );
        let (currencies, dispositions) = (s.bind(&self.currencies)?, s.bind(&self.dispositions)?);
        let (reasons, sources) = (s.bind(&self.reasons)?, s.bind(&self.sources)?);
        let methods = s.bind(&self.methods)?;
        s.cte(
            "recorded",
            &format!(
                "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, reason, learned_from, refund_state, next_attempt_at, refund_method) \
                 SELECT p, o, a, c, d, r, s, CASE WHEN d = 'refund' THEN 'pending' END, CASE WHEN d = 'refund' THEN now() END, m \
                 FROM unnest({ids}::text[], {orders}::uuid[], {amounts}::bigint[], {currencies}::text[], {dispositions}::text[], {reasons}::text[], {sources}::text[], {methods}::text[]) AS t(p, o, a, c, d, r, s, m) \
                 ON CONFLICT DO NOTHING RETURNING payment_id"
            ),
        );
        Ok(Some(s.returning("recorded")))
    }

    /// The payment ids another decider recorded first: those the insert did not return.
    fn lost(&self, inserted: Option<&Vec<String>>) -> HashSet<&'a str> {
        let inserted: HashSet<&str> = inserted
            .map(|ids| ids.iter().map(String::as_str).collect())
            .unwrap_or_default();
        self.ids
            .iter()
            .copied()
            .filter(|id| !inserted.contains(id))
            .collect()
    }
}

/// Which of `payment_ids` are already recorded (attached to their order, or
/// owed a refund). A recorded payment's disposition is final, so every later
/// report of its success is already known; a plain read, no lock. One
/// statement answers the webhooks of many payments at once (checkout's
/// look-up gathers them); it runs unprepared, planned on the table as it is,
/// for the reason given at [`LOCK_KNOWN_SQL`].
pub async fn known_among(
    pool: &PgPool,
    payment_ids: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let known: Vec<String> =
        sqlx::query_scalar("SELECT payment_id FROM payments WHERE payment_id = ANY($1)")
            .bind(payment_ids)
            .persistent(false)
            .fetch_all(pool)
            .await?;
    Ok(known.into_iter().collect())
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
