//! What a placing group reads before it decides: the SKUs' available
//! units, and what the accounts with hold limits already hold; and what a
//! late payment's revival of an expired order reads for the same limits.

use super::{LimitReached, Placement};
use crate::StoreError;
use domain::limits::Holding;
use domain::{Order, Sku};
use sqlx::PgConnection;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use uuid::Uuid;

/// Available units of `skus` (absent SKUs: none), read plainly or locked in
/// SKU order.
pub(super) async fn available(
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

/// Takes `accounts`' placing locks, in account order (sorted by the
/// caller): what they hold cannot change until the transaction ends, across
/// every checkout instance.
pub(crate) async fn lock_accounts(
    conn: &mut PgConnection,
    accounts: &[Uuid],
) -> Result<(), StoreError> {
    if accounts.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('soldonce-account:' || a::text, 0)) \
         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(a, i)",
    )
    .bind(accounts)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// For a revival of `order` (its account locked by [`lock_accounts`]):
/// each of its SKUs with a per-account limit, and the units of it the
/// account holds in its other pending or confirmed orders.
pub(crate) async fn holdings(
    conn: &mut PgConnection,
    order: &Order,
) -> Result<Vec<Holding>, StoreError> {
    let skus: Vec<&str> = order.lines.iter().map(|l| l.sku.as_str()).collect();
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT p.sku, p.per_account_limit, \
                (SELECT coalesce(sum(l.quantity), 0) FROM orders o JOIN order_lines l ON l.order_id = o.id \
                 WHERE o.account_id = $2 AND o.id <> $3 AND l.sku = p.sku AND o.state IN ('payment_pending', 'confirmed'))::bigint \
         FROM products p WHERE p.sku = ANY($1) AND p.per_account_limit IS NOT NULL",
    )
    .bind(&skus)
    .bind(order.account_id)
    .bind(order.id)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|(sku, limit, held)| {
            Ok(Holding {
                sku: Sku::parse(&sku)
                    .map_err(|e| StoreError::Corrupt(format!("product {sku:?}: {e}")))?,
                limit,
                held,
            })
        })
        .collect()
}

/// What the accounts with hold limits hold, kept current as the group's
/// orders are accepted.
#[derive(Clone, Default)]
pub(super) struct Holds {
    reserved: HashMap<Uuid, i64>,
    per_sku: HashMap<(Uuid, String), i64>,
}

impl Holds {
    /// Locks the limited accounts (in account order, one placement of an
    /// account at a time across every checkout) and reads what they hold.
    pub(super) async fn read(
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
        lock_accounts(conn, &accounts).await?;
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

    /// The limit `p` would break, if any (the domain decides, on these counts).
    pub(super) fn refuse(
        &self,
        p: &Placement<'_>,
        asked: &BTreeMap<&Sku, i64>,
    ) -> Option<LimitReached> {
        let account = p.key.account_id;
        let reserved = self.reserved.get(&account).copied().unwrap_or(0);
        let held_of = |sku: &Sku| {
            self.per_sku
                .get(&(account, sku.as_str().to_owned()))
                .copied()
                .unwrap_or(0)
        };
        domain::limits::placing_breaks(&p.limits, reserved, held_of, asked)
    }

    /// Counts an accepted order in what its account holds.
    pub(super) fn add(&mut self, p: &Placement<'_>, asked: &BTreeMap<&Sku, i64>) {
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
