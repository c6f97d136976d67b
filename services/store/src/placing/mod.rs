//! Placing orders, many per transaction (coalesced reservations). A hot
//! SKU is one row, and PostgreSQL releases a row lock only after the
//! commit's WAL flush: one order per transaction sells at most one order
//! per flush. [`place`] commits a whole group of placements in one
//! transaction instead — each SKU's row moved once for the group — with
//! every per-order guarantee kept: each key is claimed or answered on its
//! own, orders are served in arrival order, each all-or-nothing, and a
//! refusal is stored under its key in the same transaction.
//!
//! The transaction, in lock order (so two groups never deadlock):
//! 1. try-lock every key (never waits: a key another request holds is
//!    `InFlight`), then read the keys already stored (replays, mismatches);
//! 2. lock the accounts whose hold limits apply, in account order, and
//!    read what they hold;
//! 3. read the SKUs' available units, allocate in arrival order in memory;
//! 4. write every key with its final answer, then the accepted orders on
//!    the write path, stock last (one conditional statement for all SKUs).
//!
//! Step 3 reads without a lock; if another writer took the units since,
//! step 4's conditional update fails and the group is redone reading the
//! SKUs `FOR UPDATE` (in SKU order). A placement that fails in the database
//! (a constraint, a trigger, a bad row) fails alone: the group is run again
//! in a fresh transaction whose step 4 finds the failing placements by
//! bisection under savepoints (`isolate.rs`), then writes every other
//! placement in one statement and commits once. Only when bisection finds
//! no culprit is the group retried one placement per transaction. What is
//! decided in memory between the reads and the write (who claims a key,
//! what a repeat hears, the allocation) is `decide.rs`.

mod decide;
mod holds;
mod isolate;
mod keys;

pub use keys::KEYS_SQL;

use crate::idempotency::{Claim, KeyedRequest, StoredResponse};
use crate::statement::Written;
use crate::StoreError;
use decide::{allocate, firsts_and_repeats, repeated};
use domain::{Event, Order, Sku};
use events::Metadata;
use holds::Holds;
pub(crate) use holds::{holdings, lock_accounts};
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeSet, HashMap};

/// What became of a placement.
#[derive(Debug, Clone, PartialEq)]
pub enum PlaceOutcome {
    Placed,
    OutOfStock(Sku),
    Claim(Claim),
    /// The account would hold more than a limit allows.
    LimitReached(LimitReached),
}

/// Limits on what one account may hold (decided by `domain::limits`),
/// checked in the placing transaction under a per-account lock, so they
/// hold across every checkout instance.
pub use domain::limits::{HoldLimits, LimitReached};

/// One order to place: its key, the answer stored if it is placed, the
/// events that place it and their fold.
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    pub key: KeyedRequest<'a>,
    pub accepted: StoredResponse,
    /// The fold of `events`.
    pub order: Order,
    pub events: Vec<Event>,
    pub meta: Metadata,
    pub limits: HoldLimits,
}

/// How a group was committed, for the caller's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupReport {
    /// Transactions run (1 unless retried).
    pub transactions: usize,
    /// The unlocked read was stale: redone with the SKUs locked.
    pub relocked: bool,
    /// The group's statement failed: run again with its failing placements
    /// found by bisection, the rest still committed together.
    pub bisected: bool,
    /// Bisection found no culprit: retried one placement per transaction.
    pub isolated: bool,
    /// Placements that failed in the database on their own (their
    /// requests hear an error; the rest of the group did not).
    pub failed_alone: usize,
    /// Trial statements run under a savepoint to find failing placements.
    pub probes: usize,
    /// Transactions PostgreSQL aborted to break a deadlock, run again.
    pub transient_retries: u32,
}

/// One outcome per placement, in the group's order: what became of it, or
/// the database's error for a placement that failed alone.
pub type Outcomes = Vec<Result<PlaceOutcome, StoreError>>;

/// Places every order of `group` (in arrival order) in one transaction;
/// one outcome per placement, in the same order. `refusal` renders the
/// answer stored under the key of an order refused for stock or a limit.
/// `Err` only when the database is unavailable, for the whole group.
pub async fn place(
    pool: &PgPool,
    group: &[Placement<'_>],
    refusal: impl Fn(&PlaceOutcome) -> StoredResponse,
) -> Result<(Outcomes, GroupReport), StoreError> {
    let mut report = GroupReport::default();
    let error = match attempt(pool, group, &refusal, &mut report, false).await {
        Ok(outcomes) => return Ok((outcomes, report)),
        Err(e) if e.is_unavailable() => return Err(e),
        Err(e) if group.len() == 1 => {
            report.failed_alone = 1;
            return Ok((vec![Err(e)], report));
        }
        Err(e) => e,
    };
    tracing::warn!(error = %error, size = group.len(), "group failed: finding the placements that fail");
    report.bisected = true;
    let error = match attempt(pool, group, &refusal, &mut report, true).await {
        Ok(outcomes) => {
            report.failed_alone = outcomes.iter().filter(|o| o.is_err()).count();
            return Ok((outcomes, report));
        }
        Err(e) if e.is_unavailable() => return Err(e),
        Err(e) => e,
    };
    tracing::warn!(error = %error, size = group.len(), "no single placement fails: placing the group one by one");
    report.isolated = true;
    let mut outcomes = Vec::with_capacity(group.len());
    for one in group {
        let single = attempt(
            pool,
            std::slice::from_ref(one),
            &refusal,
            &mut report,
            false,
        )
        .await;
        outcomes.push(single.and_then(|mut o| o.remove(0)));
    }
    report.failed_alone = outcomes.iter().filter(|o| o.is_err()).count();
    Ok((outcomes, report))
}

/// How many times a transaction PostgreSQL aborted to break a deadlock is run again.
const TRANSIENT_RETRIES: u32 = 3;

/// [`attempt_once`], run again when PostgreSQL aborted it to break a
/// deadlock or a serialization conflict (nothing of it was committed).
async fn attempt(
    pool: &PgPool,
    group: &[Placement<'_>],
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
    report: &mut GroupReport,
    bisect: bool,
) -> Result<Outcomes, StoreError> {
    let mut retries = 0;
    loop {
        match attempt_once(pool, group, refusal, report, bisect).await {
            Err(e) if e.is_transient() && retries < TRANSIENT_RETRIES => {
                retries += 1;
                report.transient_retries += 1;
                tracing::warn!(error = %e, size = group.len(), retries, "placement aborted by the database: running it again");
            }
            other => return other,
        }
    }
}

/// One try, then (if the unlocked read was stale) one with the SKUs locked.
async fn attempt_once(
    pool: &PgPool,
    group: &[Placement<'_>],
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
    report: &mut GroupReport,
    bisect: bool,
) -> Result<Outcomes, StoreError> {
    for lock_stock in [false, true] {
        report.transactions += 1;
        // Held past the commit: the confirmation reads this server's WAL position.
        let mut conn = pool.acquire().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let how = How { lock_stock, bisect };
        let placed = match place_in(&mut tx, group, refusal, how, report).await {
            Ok(placed) => placed,
            Err(e) => {
                // Roll back now, not when the pool next uses the connection:
                // until then the aborted transaction still holds the group's
                // key locks, and a run again would find its own keys in
                // flight (409 to buyers whose keys are new).
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        match placed {
            Some((outcomes, waits)) => {
                tx.commit().await?;
                // No 202 (nor a replay of one) that a failover could take back.
                crate::replication::confirm_if(&mut conn, waits, "checkout").await?;
                return Ok(outcomes);
            }
            None => {
                tx.rollback().await?;
                report.relocked = true;
            }
        }
    }
    Err(StoreError::Corrupt(
        "stock ran short with the SKUs locked".into(),
    ))
}

/// How a group's transaction runs.
#[derive(Clone, Copy)]
struct How {
    /// Read the SKUs' rows `FOR UPDATE` (the unlocked read was stale).
    lock_stock: bool,
    /// Find failing placements by bisection instead of failing the group.
    bisect: bool,
}

/// The group's transaction: its outcomes, and whether its commit will wait
/// for synchronous standbys (`None`: not known); `None` when the stock
/// read was stale (roll back and retry with `lock_stock`).
async fn place_in(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
    how: How,
    report: &mut GroupReport,
) -> Result<Option<(Outcomes, Option<bool>)>, StoreError> {
    let mut outcomes: Vec<Option<PlaceOutcome>> = vec![None; group.len()];
    let (firsts, repeats) = firsts_and_repeats(group);

    // 1. Claim the keys.
    let (candidates, stored, waits) = claim_keys(conn, group, &firsts, &mut outcomes).await?;

    // 2. What the limited accounts hold, under their locks.
    let holds = Holds::read(conn, group, &candidates).await?;

    // 3. Allocate in arrival order; 4. write (finding the failing placements).
    let written = allocate_and_write(conn, group, &candidates, holds, refusal, how, report).await?;
    let Some((decided, mut failed)) = written else {
        return Ok(None);
    };
    for (i, outcome) in decided {
        outcomes[i] = Some(outcome);
    }

    for (i, first) in repeats {
        let heard = repeated(
            group,
            i,
            first,
            &outcomes[first],
            stored.get(&first),
            refusal,
        );
        outcomes[i] = Some(PlaceOutcome::Claim(heard));
    }
    let outcomes = outcomes
        .into_iter()
        .enumerate()
        .map(|(i, o)| match failed.remove(&i) {
            Some(e) => Err(e),
            None => Ok(o.unwrap_or(PlaceOutcome::Claim(Claim::InFlight))),
        })
        .collect();
    Ok(Some((outcomes, waits)))
}

/// Step 1: claims the `firsts`' keys. Returns the placements that claimed
/// theirs (the candidates), each key stored before, by placement, and
/// whether the commit will wait for standbys ([`keys::claim`]); the
/// others' outcomes go into `outcomes`.
async fn claim_keys(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    firsts: &[usize],
    outcomes: &mut [Option<PlaceOutcome>],
) -> Result<(Vec<usize>, HashMap<usize, keys::StoredKey>, Option<bool>), StoreError> {
    let (claims, waits) = keys::claim(conn, group, firsts).await?;
    let mut candidates = Vec::with_capacity(firsts.len());
    let mut stored = HashMap::new();
    for (i, (claim, key)) in firsts.iter().copied().zip(claims) {
        match claim {
            Claim::Claimed => candidates.push(i),
            other => outcomes[i] = Some(PlaceOutcome::Claim(other)),
        }
        if let Some(key) = key {
            stored.insert(i, key);
        }
    }
    Ok((candidates, stored, waits))
}

/// Steps 3 and 4: reads the SKUs' units, allocates the candidates in
/// arrival order and writes them; with `how.bisect`, placements that fail
/// in the database are set aside and the rest allocated again. Each
/// candidate's outcome and the failures; `None` when the read was stale.
async fn allocate_and_write(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    candidates: &[usize],
    holds: Holds,
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
    how: How,
    report: &mut GroupReport,
) -> Result<Option<(Vec<(usize, PlaceOutcome)>, HashMap<usize, StoreError>)>, StoreError> {
    let skus: BTreeSet<&str> = candidates
        .iter()
        .flat_map(|&i| group[i].order.lines.iter().map(|l| l.sku.as_str()))
        .collect();
    let remaining = holds::available(conn, &skus, how.lock_stock).await?;
    let mut failed: HashMap<usize, StoreError> = HashMap::new();
    loop {
        let left: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|i| !failed.contains_key(i))
            .collect();
        let (decided, writes) = allocate(group, &left, holds.clone(), remaining.clone(), refusal);
        let written = if how.bisect {
            match isolate::write_or_find(conn, group, &writes, report).await? {
                Ok(written) => written,
                Err(culprits) => {
                    failed.extend(culprits);
                    continue;
                }
            }
        } else {
            isolate::write(conn, group, &writes).await?
        };
        if let Written::StockShort(_) = written {
            return Ok(None);
        }
        return Ok(Some((decided, failed)));
    }
}
