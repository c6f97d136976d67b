//! A group decided in memory, between its reads and its write: which
//! request claims each key, what a repeat of a key hears, and the
//! allocation of units in arrival order against what the accounts hold.

use super::holds::Holds;
use super::isolate::Write;
use super::{keys, PlaceOutcome, Placement};
use crate::idempotency::{Claim, StoredResponse};
use domain::{Order, Sku};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// The group's requests that claim their key (the first of each key in
/// arrival order), and each repeat of a key beside its first.
pub(super) fn firsts_and_repeats(group: &[Placement<'_>]) -> (Vec<usize>, Vec<(usize, usize)>) {
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
    (firsts, repeats)
}

/// What request `i`, repeating the key of the group's earlier request
/// `first`, hears: what the key holds once the group commits, compared as a
/// request arriving after the group would compare it — with the key's
/// stored request (`stored`, when the key was stored before the group), or
/// with `first`'s when the group stores it. A key in flight elsewhere, or
/// whose request failed in the database (nothing stored), is in flight.
pub(super) fn repeated(
    group: &[Placement<'_>],
    i: usize,
    first: usize,
    outcome: &Option<PlaceOutcome>,
    stored: Option<&keys::StoredKey>,
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
) -> Claim {
    let fingerprint = &group[i].key.fingerprint;
    let as_first = |answer: StoredResponse| {
        keys::StoredKey {
            fingerprint: group[first].key.fingerprint.to_vec(),
            response: answer,
        }
        .answer(fingerprint)
    };
    match (outcome, stored) {
        (Some(PlaceOutcome::Placed), _) => as_first(group[first].accepted.clone()),
        (Some(o @ (PlaceOutcome::OutOfStock(_) | PlaceOutcome::LimitReached(_))), _) => {
            as_first(refusal(o))
        }
        (Some(PlaceOutcome::Claim(Claim::Replay(_) | Claim::Mismatch)), Some(key)) => {
            key.answer(fingerprint)
        }
        _ => Claim::InFlight,
    }
}

/// Decides `candidates` in arrival order against what the accounts hold and
/// the units `remaining`: each one's outcome, and what the group writes.
pub(super) fn allocate(
    group: &[Placement<'_>],
    candidates: &[usize],
    mut holds: Holds,
    mut remaining: HashMap<String, i64>,
    refusal: &impl Fn(&PlaceOutcome) -> StoredResponse,
) -> (Vec<(usize, PlaceOutcome)>, Vec<Write>) {
    let mut decided = Vec::with_capacity(candidates.len());
    let mut writes = Vec::with_capacity(candidates.len());
    for &i in candidates {
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
            writes.push(Write {
                at: i,
                refused: None,
            });
        } else {
            writes.push(Write {
                at: i,
                refused: Some(refusal(&outcome)),
            });
        }
        decided.push((i, outcome));
    }
    (decided, writes)
}

/// Units an order asks for, per SKU, in SKU order.
fn units_per_sku(order: &Order) -> BTreeMap<&Sku, i64> {
    let mut asked = BTreeMap::new();
    for l in &order.lines {
        *asked.entry(&l.sku).or_insert(0) += l.quantity.get();
    }
    asked
}
