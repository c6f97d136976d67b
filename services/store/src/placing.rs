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
//! SKUs `FOR UPDATE` (in SKU order). A group that fails for any reason but
//! an unavailable database is retried one placement per transaction, so one
//! request's problem never fails the others.

use crate::idempotency::{self, Claim, KeyedRequest, StoredResponse};
use crate::write::{Changes, Statement, Written};
use crate::StoreError;
use domain::{Event, Order, Sku};
use events::Metadata;
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use uuid::Uuid;

/// What became of a placement.
#[derive(Debug, Clone, PartialEq)]
pub enum PlaceOutcome {
    Placed,
    OutOfStock(Sku),
    Claim(Claim),
    /// The account would hold more than a limit allows.
    LimitReached(LimitReached),
}

/// Limits on what one account may hold, checked in the placing transaction
/// under a per-account lock, so they hold across every checkout instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldLimits {
    /// Units the account may hold in open reservations (0: no limit).
    pub max_reserved_units: i64,
    /// Per SKU: units the account may hold in pending or confirmed orders, ever.
    pub per_account: Vec<(Sku, i64)>,
}

impl HoldLimits {
    fn active(&self) -> bool {
        self.max_reserved_units > 0 || !self.per_account.is_empty()
    }
}

/// Which limit a placement would break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitReached {
    /// Units in open reservations: the account already holds `held` of `limit`.
    ReservedUnits { limit: i64, held: i64 },
    /// One SKU per account: the account already holds `held` of `limit`.
    PerAccount { sku: Sku, limit: i64, held: i64 },
}

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
    /// The group failed: retried one placement per transaction.
    pub isolated: bool,
    /// Transactions PostgreSQL aborted to break a deadlock, run again.
    pub transient_retries: u32,
}

/// Places every order of `group` (in arrival order) in one transaction;
/// one outcome per placement, in the same order. `refusal` renders the
/// answer stored under the key of an order refused for stock or a limit.
/// `Err` only when the database is unavailable, for the whole group.
pub async fn place(
    pool: &PgPool,
    group: &[Placement<'_>],
    refusal: impl Fn(&PlaceOutcome) -> StoredResponse,
) -> Result<(Vec<Result<PlaceOutcome, StoreError>>, GroupReport), StoreError> {
    let mut report = GroupReport::default();
    match attempt(pool, group, &refusal, &mut report).await {
        Ok(outcomes) => Ok((outcomes.into_iter().map(Ok).collect(), report)),
        Err(e) if e.is_unavailable() => Err(e),
        Err(e) if group.len() == 1 => Ok((vec![Err(e)], report)),
        Err(e) => {
            tracing::warn!(error = %e, size = group.len(), "group failed: placing its orders one by one");
            report.isolated = true;
            let mut outcomes = Vec::with_capacity(group.len());
            for one in group {
                let single = attempt(pool, std::slice::from_ref(one), &refusal, &mut report).await;
                outcomes.push(single.map(|mut o| o.remove(0)));
            }
            Ok((outcomes, report))
        }
    }
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
) -> Result<Vec<PlaceOutcome>, StoreError> {
    let mut retries = 0;
    loop {
        match attempt_once(pool, group, refusal, report).await {
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
) -> Result<Vec<PlaceOutcome>, StoreError> {
    for lock_stock in [false, true] {
        report.transactions += 1;
        // Held past the commit: the confirmation reads this server's WAL position.
        let mut conn = pool.acquire().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let placed = match place_in(&mut tx, group, refusal, lock_stock).await {
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
            Some(outcomes) => {
                tx.commit().await?;
                // No 202 (nor a replay of one) that a failover could take back.
                crate::replication::confirm(&mut conn, "checkout").await?;
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

/// The group's transaction; `None` when the stock read was stale (roll
/// back and retry with `lock_stock`).
async fn place_in(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
    lock_stock: bool,
) -> Result<Option<Vec<PlaceOutcome>>, StoreError> {
    let mut outcomes: Vec<Option<PlaceOutcome>> = vec![None; group.len()];

    // A key repeated inside the group: the first in arrival order claims it.
    let mut first_of: HashMap<(Uuid, &str), usize> = HashMap::new();
    let mut repeats = Vec::new();
    let mut firsts = Vec::new();
    for (i, p) in group.iter().enumerate() {
        match first_of.get(&(p.key.account_id, p.key.key)) {
            Some(&first) => repeats.push((i, first)),
            None => {
                first_of.insert((p.key.account_id, p.key.key), i);
                firsts.push(i);
            }
        }
    }

    // 1. Claim the keys.
    let claims = claim(conn, group, &firsts).await?;
    let mut candidates = Vec::with_capacity(firsts.len());
    for (i, claim) in firsts.iter().copied().zip(claims) {
        match claim {
            Claim::Claimed => candidates.push(i),
            other => outcomes[i] = Some(PlaceOutcome::Claim(other)),
        }
    }

    // 2. What the limited accounts hold, under their locks.
    let mut holds = Holds::read(conn, group, &candidates).await?;

    // 3. Allocate in arrival order.
    let skus: BTreeSet<&str> = candidates
        .iter()
        .flat_map(|&i| group[i].order.lines.iter().map(|l| l.sku.as_str()))
        .collect();
    let mut remaining = available(conn, &skus, lock_stock).await?;
    let mut changes = Changes::new();
    let mut keys = StoredKeys::default();
    for &i in &candidates {
        let p = &group[i];
        let asked = units_per_sku(&p.order);
        let outcome = match holds.refuse(p, &asked) {
            Some(reached) => PlaceOutcome::LimitReached(reached),
            None => match asked
                .iter()
                .find(|(sku, units)| remaining.get(sku.as_str()).copied().unwrap_or(0) < **units)
            {
                Some((sku, _)) => PlaceOutcome::OutOfStock((*sku).clone()),
                None => PlaceOutcome::Placed,
            },
        };
        if outcome == PlaceOutcome::Placed {
            for (sku, units) in &asked {
                if let Some(left) = remaining.get_mut(sku.as_str()) {
                    *left -= units;
                }
            }
            holds.add(p, &asked);
            changes.order(None, &p.events, &p.meta)?;
            keys.push(&p.key, &p.accepted);
        } else {
            keys.push(&p.key, &refusal(&outcome));
        }
        outcomes[i] = Some(outcome);
    }

    // 4. Keys, then the orders on the write path (stock last), in one statement.
    let mut statement = Statement::new();
    keys.insert_into(&mut statement)?;
    changes.add_to(&mut statement)?;
    if let Written::StockShort(_) = statement.run(conn).await? {
        return Ok(None);
    }

    // A repeated key hears what its first request's key now holds.
    for (i, first) in repeats {
        let same_body = group[i].key.fingerprint == group[first].key.fingerprint;
        let outcome = match (&outcomes[first], same_body) {
            (_, false) => Claim::Mismatch,
            (Some(PlaceOutcome::Placed), true) => Claim::Replay(group[first].accepted.clone()),
            (Some(o @ (PlaceOutcome::OutOfStock(_) | PlaceOutcome::LimitReached(_))), true) => {
                Claim::Replay(refusal(o))
            }
            (Some(PlaceOutcome::Claim(c)), true) => c.clone(),
            (None, true) => Claim::InFlight,
        };
        outcomes[i] = Some(PlaceOutcome::Claim(outcome));
    }
    Ok(Some(
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(PlaceOutcome::Claim(Claim::InFlight)))
            .collect(),
    ))
}

/// Units an order asks for, per SKU, in SKU order.
fn units_per_sku(order: &Order) -> BTreeMap<&Sku, i64> {
    let mut asked = BTreeMap::new();
    for l in &order.lines {
        *asked.entry(&l.sku).or_insert(0) += l.quantity.get();
    }
    asked
}

/// The stored responses of idempotency keys (`$1` accounts, `$2` keys,
/// pairwise), each with its 1-based position. Run unprepared, planned at
/// each call on the table as it is then, as the inbox's look-up is (see
/// `inbox::SEEN_SQL`): a generic plan made while the table was small
/// hashes every stored key (a sequential scan), where a plan that sees the
/// arrays probes the key's index once per key.
const KEYS_SQL: &str = "SELECT t.i, k.fingerprint, k.status, k.response_body, k.order_id \
     FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS t(a, k, i) \
     JOIN idempotency_keys k ON k.account_id = t.a AND k.key = t.k";

/// Try-locks the keys of `which` (a lock held elsewhere: `InFlight`; never
/// waits), then, in a statement of its own so it sees every commit made
/// before the locks were taken, reads the keys already stored.
async fn claim(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    which: &[usize],
) -> Result<Vec<Claim>, StoreError> {
    let locks: Vec<i64> = which
        .iter()
        .map(|&i| idempotency::lock_id(&group[i].key))
        .collect();
    let got: Vec<(i64, bool)> = sqlx::query_as(
        "SELECT i, pg_try_advisory_xact_lock(l) FROM unnest($1::bigint[]) WITH ORDINALITY AS t(l, i)",
    )
    .bind(&locks)
    .fetch_all(&mut *conn)
    .await?;
    let mut claims = vec![Claim::InFlight; which.len()];
    let mut locked = Vec::new();
    for (i, got) in got {
        let at = usize::try_from(i - 1).map_err(|_| StoreError::Corrupt("ordinality".into()))?;
        if got && at < which.len() {
            claims[at] = Claim::Claimed;
            locked.push(at);
        }
    }
    if locked.is_empty() {
        return Ok(claims);
    }
    let accounts: Vec<Uuid> = locked
        .iter()
        .map(|&a| group[which[a]].key.account_id)
        .collect();
    let keys: Vec<&str> = locked.iter().map(|&a| group[which[a]].key.key).collect();
    type Stored = (i64, Vec<u8>, i16, serde_json::Value, Option<Uuid>);
    let stored: Vec<Stored> = sqlx::query_as(KEYS_SQL)
        .persistent(false)
        .bind(&accounts)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?;
    for (i, fingerprint, status, body, order_id) in stored {
        let at = usize::try_from(i - 1)
            .ok()
            .and_then(|n| locked.get(n).copied())
            .ok_or_else(|| StoreError::Corrupt("ordinality".into()))?;
        let p = &group[which[at]];
        claims[at] = if fingerprint != p.key.fingerprint {
            Claim::Mismatch
        } else {
            Claim::Replay(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt("idempotency status".into()))?,
                body,
                order_id,
            })
        };
    }
    Ok(claims)
}

/// Available units of `skus` (absent SKUs: none), read plainly or locked in
/// SKU order.
async fn available(
    conn: &mut PgConnection,
    skus: &BTreeSet<&str>,
    lock: bool,
) -> Result<HashMap<String, i64>, StoreError> {
    if skus.is_empty() {
        return Ok(HashMap::new());
    }
    let list: Vec<&str> = skus.iter().copied().collect();
    let sql = if lock {
        "SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE"
    } else {
        "SELECT sku, available FROM stock WHERE sku = ANY($1)"
    };
    let rows: Vec<(String, i64)> = sqlx::query_as(sql)
        .bind(&list)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// What the accounts with hold limits hold, kept current as the group's
/// orders are accepted.
#[derive(Default)]
struct Holds {
    reserved: HashMap<Uuid, i64>,
    per_sku: HashMap<(Uuid, String), i64>,
}

impl Holds {
    /// Locks the limited accounts (in account order, one placement of an
    /// account at a time across every checkout) and reads what they hold.
    async fn read(
        conn: &mut PgConnection,
        group: &[Placement<'_>],
        candidates: &[usize],
    ) -> Result<Holds, StoreError> {
        let limited: Vec<&Placement<'_>> = candidates
            .iter()
            .map(|&i| &group[i])
            .filter(|p| p.limits.active())
            .collect();
        let mut holds = Holds::default();
        if limited.is_empty() {
            return Ok(holds);
        }
        let accounts: Vec<Uuid> = limited
            .iter()
            .map(|p| p.key.account_id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended('soldonce-account:' || a::text, 0)) \
             FROM unnest($1::uuid[]) WITH ORDINALITY AS t(a, i)",
        )
        .bind(&accounts)
        .execute(&mut *conn)
        .await?;
        let reserved: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT o.account_id, coalesce(sum(l.quantity), 0)::bigint FROM orders o JOIN order_lines l ON l.order_id = o.id \
             WHERE o.account_id = ANY($1) AND o.state = 'payment_pending' GROUP BY o.account_id",
        )
        .bind(&accounts)
        .fetch_all(&mut *conn)
        .await?;
        holds.reserved.extend(reserved);
        let skus: Vec<&str> = limited
            .iter()
            .flat_map(|p| p.limits.per_account.iter().map(|(s, _)| s.as_str()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !skus.is_empty() {
            let per_sku: Vec<(Uuid, String, i64)> = sqlx::query_as(
                "SELECT o.account_id, l.sku, coalesce(sum(l.quantity), 0)::bigint FROM orders o JOIN order_lines l ON l.order_id = o.id \
                 WHERE o.account_id = ANY($1) AND l.sku = ANY($2) AND o.state IN ('payment_pending', 'confirmed') \
                 GROUP BY o.account_id, l.sku",
            )
            .bind(&accounts)
            .bind(&skus)
            .fetch_all(&mut *conn)
            .await?;
            holds
                .per_sku
                .extend(per_sku.into_iter().map(|(a, s, n)| ((a, s), n)));
        }
        Ok(holds)
    }

    /// The limit `p` would break, if any.
    fn refuse(&self, p: &Placement<'_>, asked: &BTreeMap<&Sku, i64>) -> Option<LimitReached> {
        let account = p.key.account_id;
        let max = p.limits.max_reserved_units;
        if max > 0 {
            let held = self.reserved.get(&account).copied().unwrap_or(0);
            if held.saturating_add(asked.values().sum()) > max {
                return Some(LimitReached::ReservedUnits { limit: max, held });
            }
        }
        for (sku, limit) in &p.limits.per_account {
            let Some(units) = asked.get(sku) else {
                continue;
            };
            let held = self
                .per_sku
                .get(&(account, sku.as_str().to_owned()))
                .copied()
                .unwrap_or(0);
            if held.saturating_add(*units) > *limit {
                return Some(LimitReached::PerAccount {
                    sku: sku.clone(),
                    limit: *limit,
                    held,
                });
            }
        }
        None
    }

    /// Counts an accepted order in what its account holds.
    fn add(&mut self, p: &Placement<'_>, asked: &BTreeMap<&Sku, i64>) {
        if !p.limits.active() {
            return;
        }
        let account = p.key.account_id;
        *self.reserved.entry(account).or_insert(0) += asked.values().sum::<i64>();
        for (sku, units) in asked {
            *self
                .per_sku
                .entry((account, sku.as_str().to_owned()))
                .or_insert(0) += units;
        }
    }
}

/// Keys with their final answers, inserted in one statement.
#[derive(Default)]
struct StoredKeys<'a> {
    accounts: Vec<Uuid>,
    keys: Vec<&'a str>,
    fingerprints: Vec<Vec<u8>>,
    statuses: Vec<i16>,
    bodies: Vec<serde_json::Value>,
    orders: Vec<Option<Uuid>>,
}

impl<'a> StoredKeys<'a> {
    fn push(&mut self, key: &KeyedRequest<'a>, answer: &StoredResponse) {
        self.accounts.push(key.account_id);
        self.keys.push(key.key);
        self.fingerprints.push(key.fingerprint.to_vec());
        self.statuses
            .push(i16::try_from(answer.status).unwrap_or(500));
        self.bodies.push(answer.body.clone());
        self.orders.push(answer.order_id);
    }

    /// Inserts the keys, as the first fragment of `statement`.
    fn insert_into<'q>(&'q self, statement: &mut Statement<'q>) -> Result<(), StoreError> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let s = statement;
        let (accounts, keys) = (s.bind(&self.accounts)?, s.bind(&self.keys)?);
        let (fingerprints, statuses) = (s.bind(&self.fingerprints)?, s.bind(&self.statuses)?);
        let (bodies, orders) = (s.bind(&self.bodies)?, s.bind(&self.orders)?);
        s.cte(
            "keyed",
            &format!(
                "INSERT INTO idempotency_keys (account_id, key, fingerprint, status, response_body, order_id) \
                 SELECT * FROM unnest({accounts}::uuid[], {keys}::text[], {fingerprints}::bytea[], {statuses}::smallint[], {bodies}::jsonb[], {orders}::uuid[]) \
                 RETURNING 1"
            ),
        );
        s.in_order("keyed");
        Ok(())
    }
}
