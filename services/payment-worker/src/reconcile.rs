//! Reconciliation against the PSP's own books. It walks the PSP's payment
//! listing by creation time and guarantees that every succeeded payment is
//! attached to exactly one confirmed order or refunded — recording, through
//! the store's one path for payment facts, whatever no other path learned —
//! and that every confirmed order placed in the window has exactly one
//! standing payment of its amount and currency. What it cannot repair it
//! names; the audit reports the last run's findings.

use crate::psp::{Psp, PspError};
use chrono::{DateTime, Utc};
use domain::PspStatus;
use futures::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use store::payments::{Learned, Source};
use store::reconcile::Finding;

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
    pub findings: Vec<Finding>,
    pub seconds: f64,
}

impl ReconcileReport {
    /// Whether the books agree, after repairs.
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

/// Walks the listing from `since` (the stored cursor less [`LOOKBACK`] when
/// `None` and `periodic`; everything when `None` otherwise), repairs, checks,
/// and records the run; a periodic run also moves the cursor on.
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
    let mut report = ReconcileReport {
        since,
        ..ReconcileReport::default()
    };
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let (mut newest, mut unsettled): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = (None, None);
    let mut cursor: Option<String> = None;
    loop {
        let page = psp.list_payments(since, cursor.as_deref(), PAGE).await?;
        let ids: Vec<String> = page.data.iter().map(|p| p.id.clone()).collect();
        let recorded = store::reconcile::recorded(pool, &ids).await?;
        for payment in &page.data {
            report.payments_seen += 1;
            newest = newest.max(Some(payment.created_at));
            let fact = payment.fact();
            match fact.status {
                PspStatus::Unknown(_) => {
                    unsettled =
                        Some(unsettled.map_or(payment.created_at, |u| u.min(payment.created_at)))
                }
                PspStatus::Failed => {
                    if !recorded.contains_key(&payment.id) {
                        learn(pool, &fact).await?;
                    }
                }
                PspStatus::Succeeded => {
                    report.succeeded += 1;
                    let standing = payment.refunded_minor() < payment.amount_minor;
                    let finding = match recorded.get(&payment.id) {
                        None if !standing => Some(finding(
                            "refunded_elsewhere",
                            &payment.id,
                            "refunded at the PSP, but soldonce never recorded the payment",
                            false,
                        )),
                        None => match learn(pool, &fact).await? {
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
                        Some(r) if r.disposition == "attached" && !standing => {
                            let order = r.order_id.map(|o| o.to_string()).unwrap_or_default();
                            Some(finding("attached_payment_refunded", &payment.id, &format!("order {order} is confirmed on it, but the PSP shows it refunded"), false))
                        }
                        Some(r) if r.refund_state.as_deref() == Some("succeeded") && standing => {
                            Some(finding(
                                "refund_missing",
                                &payment.id,
                                "recorded as refunded, but the PSP shows it standing",
                                false,
                            ))
                        }
                        Some(_) => None,
                    };
                    if let Some(f) = finding {
                        if f.repaired {
                            report.repaired += 1;
                        }
                        report.findings.push(f);
                    }
                    seen.insert(
                        payment.id.clone(),
                        Seen {
                            standing,
                            amount_minor: payment.amount_minor,
                            currency: payment.currency.clone(),
                        },
                    );
                }
            }
        }
        match (page.has_more, page.next_cursor) {
            (true, Some(next)) => cursor = Some(next),
            _ => break,
        }
    }
    check_confirmed(pool, since, listed_at, &seen, &mut report).await?;
    report.seconds = started.elapsed().as_secs_f64();
    let next_cursor = if periodic { unsettled.or(newest) } else { None };
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
    metrics::histogram!("soldonce_reconcile_seconds").record(report.seconds);
    Ok(report)
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
