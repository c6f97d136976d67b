//! Reconciliation against the PSP's own books. It walks the PSP's payment
//! listing by creation time and guarantees that every succeeded payment is
//! attached to exactly one confirmed order or refunded — recording, through
//! the store's one path for payment facts, whatever no other path learned —
//! and that every confirmed order placed in the window has exactly one
//! standing payment of its amount and currency. What it cannot repair it
//! names; the audit reports the last run's findings. Only payments soldonce
//! made (its `pay:<order_id>` key, for an order it holds) are ever touched:
//! the others on a shared PSP account are listed as foreign and left alone.

use crate::psp::{Psp, PspError, PspPayment};
use chrono::{DateTime, Utc};
use domain::PspStatus;
use futures::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use store::payments::{Learned, Source};
use store::reconcile::{Finding, ForeignPayment};
use uuid::Uuid;

/// How far behind its cursor a periodic run starts again: payments become
/// visible in the listing slightly out of creation order.
pub const LOOKBACK: Duration = Duration::from_secs(300);
const PAGE: u32 = 500;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("the PSP's listing: {0}")]
    Psp(#[from] PspError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// The kind of finding naming a payment whose fact could not be recorded:
/// the next run asks the PSP for it again by id, wherever its cursor is.
pub const UNRECORDABLE: &str = "unrecordable_payment";

/// What one run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReconcileReport {
    /// Where the walk started (`None`: at the beginning).
    pub since: Option<DateTime<Utc>>,
    pub payments_seen: u64,
    pub succeeded: u64,
    pub confirmed_orders_checked: u64,
    /// Payments no other path had recorded, now recorded.
    pub repaired: u64,
    /// Payments soldonce did not make (a shared PSP account): listed, never touched.
    pub foreign: Vec<ForeignPayment>,
    pub findings: Vec<Finding>,
    pub seconds: f64,
}

impl ReconcileReport {
    /// Whether the books agree, after repairs. Foreign payments are not soldonce's books.
    pub fn clean(&self) -> bool {
        self.findings.iter().all(|f| f.repaired)
    }
}

/// What the walk saw of one succeeded payment.
struct Seen {
    standing: bool,
    amount_minor: i64,
    currency: String,
}

/// One run's walk over the PSP's payments.
#[derive(Default)]
struct Walk {
    report: ReconcileReport,
    seen: HashMap<String, Seen>,
    /// Every payment checked this run.
    done: HashSet<String>,
    newest: Option<DateTime<Utc>>,
    unsettled: Option<DateTime<Utc>>,
}

/// Walks the listing from `since` (the stored cursor less [`LOOKBACK`] when
/// `None` and `periodic`; everything when `None` otherwise), repairs, checks,
/// and records the run; a periodic run also moves the cursor on. A fact
/// that cannot be recorded is named ([`UNRECORDABLE`]) and the walk goes on;
/// the next run asks for that payment again.
pub async fn run(
    pool: &PgPool,
    psp: &Psp,
    since: Option<DateTime<Utc>>,
    periodic: bool,
) -> Result<ReconcileReport, ReconcileError> {
    let started = Instant::now();
    let since = match (since, periodic) {
        (Some(t), _) => Some(t),
        (None, true) => store::reconcile::cursor(pool)
            .await?
            .map(|c| c - chrono::Duration::from_std(LOOKBACK).unwrap_or_default()),
        (None, false) => None,
    };
    let listed_at = store::now();
    let mut walk = Walk {
        report: ReconcileReport {
            since,
            ..ReconcileReport::default()
        },
        ..Walk::default()
    };
    // The payments the last run could not record, wherever the cursor is now.
    let mut again = vec![];
    for id in store::reconcile::last_findings(pool, UNRECORDABLE).await? {
        again.extend(psp.payment(&id).await?);
    }
    walk.page(pool, &again, false).await?;
    let mut cursor: Option<String> = None;
    loop {
        let page = psp.list_payments(since, cursor.as_deref(), PAGE).await?;
        let fresh: Vec<PspPayment> = page
            .data
            .into_iter()
            .filter(|p| !walk.done.contains(&p.id))
            .collect();
        walk.page(pool, &fresh, true).await?;
        match (page.has_more, page.next_cursor) {
            (true, Some(next)) => cursor = Some(next),
            _ => break,
        }
    }
    let Walk {
        mut report,
        seen,
        newest,
        unsettled,
        ..
    } = walk;
    check_confirmed(pool, since, listed_at, &seen, &mut report).await?;
    report.seconds = started.elapsed().as_secs_f64();
    let next_cursor = if periodic { unsettled.or(newest) } else { None };
    store::reconcile::record_foreign(pool, &report.foreign).await?;
    store::reconcile::save_run(
        pool,
        next_cursor,
        report.seconds,
        i64::try_from(report.payments_seen).unwrap_or(i64::MAX),
        &report.findings,
    )
    .await?;
    metrics::counter!("soldonce_reconcile_runs_total").increment(1);
    metrics::counter!("soldonce_reconcile_payments_seen_total").increment(report.payments_seen);
    metrics::counter!("soldonce_reconcile_repairs_total").increment(report.repaired);
    metrics::gauge!("soldonce_reconcile_findings")
        .set(report.findings.iter().filter(|f| !f.repaired).count() as f64);
    metrics::gauge!("soldonce_reconcile_foreign_payments").set(report.foreign.len() as f64);
    metrics::histogram!("soldonce_reconcile_seconds").record(report.seconds);
    Ok(report)
}

impl Walk {
    /// Checks one page of payments (`listed`: from the listing, so it moves the cursor).
    async fn page(
        &mut self,
        pool: &PgPool,
        payments: &[PspPayment],
        listed: bool,
    ) -> Result<(), ReconcileError> {
        let ids: Vec<String> = payments.iter().map(|p| p.id.clone()).collect();
        let recorded = store::reconcile::recorded(pool, &ids).await?;
        let orders: Vec<Uuid> = payments.iter().filter_map(|p| p.fact().order_id).collect();
        let states = store::reconcile::order_states(pool, &orders).await?;
        for payment in payments {
            self.done.insert(payment.id.clone());
            self.report.payments_seen += 1;
            let fact = payment.fact();
            let state = fact.order_id.and_then(|o| states.get(&o));
            if listed {
                self.newest = self.newest.max(Some(payment.created_at));
                if let PspStatus::Unknown(_) = fact.status {
                    let at = payment.created_at;
                    self.unsettled = Some(self.unsettled.map_or(at, |u| u.min(at)));
                }
            }
            if state.is_none() && !recorded.contains_key(&payment.id) {
                self.report.foreign.push(foreign(payment));
                continue;
            }
            match fact.status {
                // The buyer's action is awaited by the order; expiry ends it if it never comes.
                PspStatus::Unknown(_) | PspStatus::ActionRequired => {}
                // A decline only ends a pending order: every other one was decided before.
                PspStatus::Failed if state.is_some_and(|s| s != "payment_pending") => {}
                PspStatus::Failed => {
                    if let Err(e) = learn(pool, &fact).await {
                        self.unrecordable(payment, &e);
                    }
                }
                PspStatus::Succeeded | PspStatus::Authorized => {
                    self.report.succeeded += 1;
                    let finding =
                        match succeeded(pool, payment, &fact, recorded.get(&payment.id)).await {
                            Ok(f) => f,
                            Err(e) => Some(unrecordable(payment, &e)),
                        };
                    let late = disputes(pool, payment).await;
                    for f in finding.into_iter().chain(late) {
                        if f.repaired {
                            self.report.repaired += 1;
                        }
                        self.report.findings.push(f);
                    }
                    self.seen.insert(
                        payment.id.clone(),
                        Seen {
                            standing: payment.refunded_minor() < payment.amount_minor,
                            amount_minor: payment.amount_minor,
                            currency: payment.currency.clone(),
                        },
                    );
                }
            }
        }
        Ok(())
    }

    fn unrecordable(&mut self, payment: &PspPayment, e: &ReconcileError) {
        self.report.findings.push(unrecordable(payment, e));
    }
}

/// Records a succeeded payment of soldonce's if no path did; names what disagrees.
async fn succeeded(
    pool: &PgPool,
    payment: &PspPayment,
    fact: &store::payments::PaymentFact,
    recorded: Option<&store::reconcile::Recorded>,
) -> Result<Option<Finding>, ReconcileError> {
    let standing = payment.refunded_minor() < payment.amount_minor;
    Ok(match recorded {
        None if !standing => Some(finding(
            "refunded_elsewhere",
            &payment.id,
            "refunded at the PSP, but soldonce never recorded the payment",
            false,
        )),
        None => match learn(pool, fact).await? {
            Learned::Confirmed { order, .. } => Some(finding(
                "unrecorded_payment",
                &payment.id,
                &format!("confirmed order {} on it", order.id),
                true,
            )),
            Learned::RefundDecided(reason) => Some(finding(
                "unattached_payment",
                &payment.id,
                &format!("refund recorded ({})", reason.as_str()),
                true,
            )),
            _ => None,
        },
        Some(r)
            if r.disposition == "attached"
                && !standing
                && r.operator_refunds_minor < payment.amount_minor =>
        {
            let order = r.order_id.map(|o| o.to_string()).unwrap_or_default();
            Some(finding(
                "attached_payment_refunded",
                &payment.id,
                &format!("order {order} is confirmed on it, but the PSP shows it refunded"),
                false,
            ))
        }
        Some(r) if r.refund_state.as_deref() == Some("succeeded") && standing => Some(finding(
            "refund_missing",
            &payment.id,
            "recorded as refunded, but the PSP shows it standing",
            false,
        )),
        Some(_) => None,
    })
}

/// Records the disputes the PSP lists on a payment of soldonce's that no
/// webhook recorded: a `dispute.created` that arrived before the payment
/// was learned was a receipt only. Each is recorded once (hold, finding),
/// as the webhook would have; one recorded before changes nothing.
async fn disputes(pool: &PgPool, payment: &PspPayment) -> Vec<Finding> {
    let mut found = vec![];
    for d in &payment.disputes {
        let report = store::disputes::DisputeReport {
            dispute_id: d.id.clone(),
            payment_id: payment.id.clone(),
            amount_minor: d.amount_minor,
            reason: d.reason.chars().take(64).collect(),
        };
        let recorded = async {
            let mut tx = pool.begin().await?;
            let meta = |order| events::Metadata::spontaneous("reconcile", order);
            let recorded = store::disputes::record(&mut tx, &report, meta).await?;
            tx.commit().await?;
            Ok::<_, store::StoreError>(recorded)
        }
        .await;
        match recorded {
            Ok(store::disputes::Recorded::New { order_id, held, .. }) => {
                let held = if held { ", its shipment held" } else { "" };
                found.push(finding(
                    "unrecorded_dispute",
                    &d.id,
                    &format!(
                        "dispute of payment {} recorded on order {order_id}{held}",
                        payment.id
                    ),
                    true,
                ));
            }
            Ok(_) => {}
            Err(e) => found.push(unrecordable(payment, &ReconcileError::from(e))),
        }
    }
    found
}

fn unrecordable(payment: &PspPayment, e: &ReconcileError) -> Finding {
    tracing::error!(payment_id = %payment.id, error = %e, "reconciliation could not record a payment; going on");
    finding(
        UNRECORDABLE,
        &payment.id,
        &format!("could not be recorded: {e}"),
        false,
    )
}

fn foreign(payment: &PspPayment) -> ForeignPayment {
    ForeignPayment {
        payment_id: payment.id.clone(),
        reference: payment.reference.clone(),
        idempotency_key: payment.idempotency_key.clone(),
        status: payment.status.clone(),
        amount_minor: payment.amount_minor,
        currency: payment.currency.clone(),
    }
}

/// Every confirmed order placed in the window, and confirmed before the
/// walk began, must be confirmed on a standing payment of its amount and currency.
async fn check_confirmed(
    pool: &PgPool,
    since: Option<DateTime<Utc>>,
    listed_at: DateTime<Utc>,
    seen: &HashMap<String, Seen>,
    report: &mut ReconcileReport,
) -> Result<(), ReconcileError> {
    let mut orders = store::reconcile::confirmed_since(pool, since, listed_at);
    let mut found = vec![];
    while let Some(order) = orders.next().await {
        let order = order?;
        report.confirmed_orders_checked += 1;
        let payment = order.payment_id.clone().unwrap_or_default();
        let problem = match seen.get(&payment) {
            None => Some("its payment is not in the PSP's books".to_owned()),
            // Named above, from the payment's side.
            Some(s) if !s.standing => None,
            Some(s) if s.amount_minor != order.total_minor || s.currency != order.currency => {
                Some(format!(
                    "the PSP charged {} {}, the order is {} {}",
                    s.amount_minor, s.currency, order.total_minor, order.currency
                ))
            }
            Some(_) => None,
        };
        if let Some(detail) = problem {
            found.push(finding(
                "confirmed_without_payment",
                &order.id.to_string(),
                &format!("payment {payment}: {detail}"),
                false,
            ));
        }
    }
    report.findings.extend(found);
    Ok(())
}

async fn learn(
    pool: &PgPool,
    fact: &store::payments::PaymentFact,
) -> Result<Learned, ReconcileError> {
    let meta = events::Metadata::spontaneous("reconcile", fact.order_id.unwrap_or_default());
    let mut tx = pool.begin().await.map_err(store::StoreError::from)?;
    let learned = store::payments::learn(&mut tx, fact, Source::Reconcile, &meta).await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    if let Learned::RefundDecided(reason) = &learned {
        metrics::counter!("soldonce_compensations_recorded_total", "reason" => reason.as_str(), "source" => "reconcile").increment(1);
    }
    Ok(learned)
}

fn finding(kind: &str, subject: &str, detail: &str, repaired: bool) -> Finding {
    Finding {
        kind: kind.into(),
        subject: subject.into(),
        detail: detail.into(),
        repaired,
    }
}
