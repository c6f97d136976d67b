//! Limits on what one account may hold ("1 per customer", units in unpaid
//! orders). The domain decides; the store supplies the counts, read under
//! the account's lock so they hold across every checkout instance. They
//! are checked wherever an order takes units: when it is placed, and when a
//! late payment would take an expired order's units again — a revival that
//! would break a limit is refunded (`over_limit`), never confirmed.

use crate::state::Order;
use crate::stock::Sku;
use std::collections::BTreeMap;

/// Limits on what one account may hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldLimits {
    /// Units the account may hold in open reservations (0: no limit).
    pub max_reserved_units: i64,
    /// Per SKU: units the account may hold in pending or confirmed orders, ever.
    pub per_account: Vec<(Sku, i64)>,
}

impl HoldLimits {
    /// Whether any limit applies.
    pub fn active(&self) -> bool {
        self.max_reserved_units > 0 || !self.per_account.is_empty()
    }
}

/// Which limit an order would break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitReached {
    /// Units in open reservations: the account already holds `held` of `limit`.
    ReservedUnits { limit: i64, held: i64 },
    /// One SKU per account: the account already holds `held` of `limit`.
    PerAccount { sku: Sku, limit: i64, held: i64 },
}

/// One SKU's per-account limit and the units of it the account holds in
/// its other pending or confirmed orders: what the store supplies when a
/// late payment would revive an expired order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub sku: Sku,
    pub limit: i64,
    pub held: i64,
}

/// The limit placing `asked` units per SKU would break, given the units the
/// account holds in open reservations (`reserved`) and of each SKU in live
/// orders (`held_of`).
pub fn placing_breaks(
    limits: &HoldLimits,
    reserved: i64,
    held_of: impl Fn(&Sku) -> i64,
    asked: &BTreeMap<&Sku, i64>,
) -> Option<LimitReached> {
    let max = limits.max_reserved_units;
    if max > 0 && reserved.saturating_add(asked.values().sum()) > max {
        return Some(LimitReached::ReservedUnits {
            limit: max,
            held: reserved,
        });
    }
    limits.per_account.iter().find_map(|(sku, limit)| {
        let units = asked.get(sku)?;
        let held = held_of(sku);
        (held.saturating_add(*units) > *limit).then(|| LimitReached::PerAccount {
            sku: sku.clone(),
            limit: *limit,
            held,
        })
    })
}

/// The limit reviving `order` (its units sold again at once) would break.
/// Units in open reservations do not apply: a revived order holds none.
pub fn revival_breaks(order: &Order, holdings: &[Holding]) -> Option<LimitReached> {
    order.lines.iter().find_map(|line| {
        let h = holdings.iter().find(|h| h.sku == line.sku)?;
        (h.held.saturating_add(line.quantity.get()) > h.limit).then(|| LimitReached::PerAccount {
            sku: h.sku.clone(),
            limit: h.limit,
            held: h.held,
        })
    })
}
