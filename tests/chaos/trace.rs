//! Each order's protocol trace replayed against the model's transitions.
//!
//! The trace is what went over the wire: the order's events as the stream
//! holds them (in their `Soldonce-Position` order, each once), beside the
//! buyer's answer from the load's history and each payment's end at the
//! PSP. The rules are a port of `services/domain/model/saga.pml` (the Spin
//! model of the protocol): a `202` starts an order `PENDING`; a pending
//! order is confirmed on a payment the PSP holds as succeeded, fails on one
//! it declined, is cancelled or expires; only an expired order comes back,
//! reclaimed by a late succeeded payment; a payment is refunded only after
//! a refund was decided for it, never the one an order stands on, each at
//! most once (a void likewise, of an authorization the PSP then shows
//! canceled); an order confirmed on an authorization has its capture
//! decided and recorded once, on the payment it stands on, which the PSP
//! then holds as succeeded — never both captured and voided; and no order
//! stays pending. A trace the model could not produce is named with the
//! step that broke it.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use uuid::Uuid;

/// The model's order states (`mtype state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    None,
    Pending,
    Confirmed,
    Failed,
    Cancelled,
    Expired,
}

/// One event of an order, as the stream carried it.
#[derive(Debug, Clone)]
pub struct Step {
    pub position: i64,
    pub event_type: String,
    pub data: Value,
}

/// Every order's events in the stream, each event once, in position order.
pub async fn read(nats_url: &str) -> BTreeMap<Uuid, Vec<Step>> {
    let js = bus::connect(nats_url).await.expect("connect nats");
    let stream = js.get_stream(bus::STREAM).await.expect("stream exists");
    let last = stream.cached_info().state.last_sequence;
    let mut seen = HashSet::new();
    let mut traces: BTreeMap<Uuid, Vec<Step>> = BTreeMap::new();
    for seq in 1..=last {
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        let header = |name: &str| msg.headers.get(name).map(|v| v.as_str().to_owned());
        let Some(id) = header("Nats-Msg-Id") else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let position = header(bus::POSITION_HEADER)
            .and_then(|p| p.parse().ok())
            .expect("every message carries its event's position");
        let event: Value = serde_json::from_slice(&msg.payload).expect("a JSON event");
        let wire_type = event["type"].as_str().unwrap_or_default();
        let Some(event_type) = events::names::type_name(wire_type).map(str::to_owned) else {
            continue;
        };
        if !event_type.starts_with("order.") {
            continue;
        }
        let Some(order) = event["subject"].as_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        traces.entry(order).or_default().push(Step {
            position,
            event_type,
            data: event["data"].clone(),
        });
    }
    for steps in traces.values_mut() {
        steps.sort_by_key(|s| s.position);
    }
    traces
}

/// How a payment ended at the PSP, from its books.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Psp {
    Succeeded,
    Failed,
    /// Voided (or lapsed, or abandoned): nothing was taken.
    Canceled,
    Other,
}

/// Replays every trace; one line per step the model does not allow. An
/// order no buyer was answered `202` for is one whose answer was lost: at
/// most `unanswered` (the requests that got no answer) may exist.
pub fn check(
    traces: &BTreeMap<Uuid, Vec<Step>>,
    accepted: &HashSet<Uuid>,
    unanswered: usize,
    books: &[Value],
) -> Vec<String> {
    let psp: HashMap<&str, (Psp, i64)> = books
        .iter()
        .filter_map(|p| {
            let status = match p["status"].as_str()? {
                "succeeded" => Psp::Succeeded,
                "failed" => Psp::Failed,
                "canceled" => Psp::Canceled,
                _ => Psp::Other,
            };
            let refunded = p["refunds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["status"] == "succeeded")
                .filter_map(|r| r["amount_minor"].as_i64())
                .sum();
            Some((p["id"].as_str()?, (status, refunded)))
        })
        .collect();
    let mut faults = vec![];
    let lost = traces.keys().filter(|o| !accepted.contains(*o)).count();
    if lost > unanswered {
        faults.push(format!(
            "{lost} orders in the stream were never answered 202, but only {unanswered} requests went unanswered"
        ));
    }
    let orders: BTreeSet<&Uuid> = traces.keys().chain(accepted.iter()).collect();
    for order in orders {
        let steps = traces.get(order).map(Vec::as_slice).unwrap_or_default();
        if let Err(fault) = replay(steps, accepted.contains(order), &psp) {
            faults.push(format!("order {order}: {fault}"));
        }
    }
    faults
}

/// One order's trace through the model's transitions.
fn replay(steps: &[Step], accepted: bool, psp: &HashMap<&str, (Psp, i64)>) -> Result<(), String> {
    let mut state = State::None;
    let mut total = 0;
    let mut attached: Option<String> = None;
    let mut refund_decided: BTreeSet<String> = BTreeSet::new();
    let mut refunded: BTreeSet<String> = BTreeSet::new();
    let mut voided: BTreeSet<String> = BTreeSet::new();
    // The authorization the order stands on, then whether its capture was decided, and recorded.
    let (mut uncaptured, mut capture_decided, mut captured) = (false, false, false);
    let at_psp = |p: &str| psp.get(p).map_or(Psp::Other, |s| s.0);
    for (n, step) in steps.iter().enumerate() {
        let payment = step.data["payment_id"].as_str().map(str::to_owned);
        let name = events::names::stem(&step.event_type);
        let broke = |why: &str| {
            Err(format!(
                "step {n} ({name} at position {}) from {state:?}: {why}",
                step.position
            ))
        };
        // A payment counts as the PSP's success: a free order's needs none.
        let paid = |p: &str| at_psp(p) == Psp::Succeeded || (total == 0 && p.starts_with("free:"));
        state = match (state, name) {
            (State::None, "order.placed") => {
                total = step.data["total_minor"].as_i64().unwrap_or(0);
                State::Pending
            }
            (State::None, _) => return broke("an order must start with order.placed"),
            (_, "order.placed") => return broke("placed twice"),
            (s @ (State::Pending | State::Expired), "order.confirmed") => {
                let reactivated = step.data["reactivated"].as_bool().unwrap_or(false);
                let Some(p) = payment else {
                    return broke("confirmed without a payment");
                };
                if reactivated != (s == State::Expired) {
                    return broke(
                        "only an expired order is reactivated, and only by a late payment",
                    );
                }
                if !paid(&p) {
                    return broke(&format!(
                        "confirmed on payment {p}, which the PSP does not hold as succeeded"
                    ));
                }
                if refund_decided.contains(&p) {
                    return broke(&format!(
                        "confirmed on payment {p}, already decided to be refunded"
                    ));
                }
                uncaptured = step.data["uncaptured"].as_bool().unwrap_or(false);
                attached = Some(p);
                State::Confirmed
            }
            (State::Pending, "order.payment_failed") => {
                if let Some(p) = payment.as_deref().filter(|p| at_psp(p) != Psp::Failed) {
                    return broke(&format!(
                        "failed on payment {p}, which the PSP did not decline"
                    ));
                }
                State::Failed
            }
            (State::Pending, "order.cancelled") => State::Cancelled,
            (State::Pending, "order.expired") => State::Expired,
            (s, "order.refund_decided") => {
                let Some(p) = payment else {
                    return broke("a refund decided without a payment");
                };
                if attached.as_deref() == Some(p.as_str()) {
                    return broke(&format!("refunds payment {p}, which the order stands on"));
                }
                if !refund_decided.insert(p.clone()) {
                    return broke(&format!("the refund of payment {p} decided twice"));
                }
                s
            }
            (s, "order.refunded") => {
                let Some(p) = payment else {
                    return broke("refunded without a payment");
                };
                if !refund_decided.contains(&p) {
                    return broke(&format!("payment {p} refunded with no refund decided"));
                }
                if refunded.contains(&p) || voided.contains(&p) {
                    return broke(&format!("payment {p} refunded twice"));
                }
                if step.data["void"].as_bool().unwrap_or(false) {
                    voided.insert(p);
                } else {
                    refunded.insert(p);
                }
                s
            }
            (State::Confirmed, "order.capture_decided") => {
                if !uncaptured || capture_decided {
                    return broke("a capture decided for no authorization, or twice");
                }
                if payment != attached {
                    return broke("captures another payment than the one the order stands on");
                }
                capture_decided = true;
                State::Confirmed
            }
            (State::Confirmed, "order.captured") => {
                if !capture_decided || captured || payment != attached {
                    return broke("captured with no capture decided, twice, or another payment");
                }
                captured = true;
                State::Confirmed
            }
            (_, other) => return broke(&format!("{other} is not a move the model allows here")),
        };
    }
    if accepted && state == State::None {
        return Err("answered 202 but the stream holds none of its events".into());
    }
    if state == State::Pending {
        return Err("never ended: still pending".into());
    }
    if state == State::Confirmed && uncaptured && !captured {
        return Err("its authorization never ended captured".into());
    }
    if let Some(p) = attached.as_deref().filter(|_| captured) {
        if at_psp(p) != Psp::Succeeded {
            return Err(format!(
                "payment {p} is captured in the trace, not at the PSP"
            ));
        }
    }
    for p in &voided {
        if at_psp(p) != Psp::Canceled {
            return Err(format!(
                "payment {p} is voided in the trace, not at the PSP"
            ));
        }
    }
    for p in &refunded {
        match psp.get(p.as_str()) {
            Some((Psp::Succeeded, amount)) if *amount > 0 => {}
            _ => {
                return Err(format!(
                    "payment {p} is refunded in the trace, not at the PSP"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(position: i64, event_type: &str, data: Value) -> Step {
        Step {
            position,
            event_type: format!("{event_type}.v1"),
            data,
        }
    }

    fn books() -> Vec<Value> {
        vec![
            json!({"id": "pay_ok", "status": "succeeded", "refunds": []}),
            json!({"id": "pay_late", "status": "succeeded", "refunds": [{"status": "succeeded", "amount_minor": 100}]}),
            json!({"id": "pay_no", "status": "failed", "refunds": []}),
            json!({"id": "pay_void", "status": "canceled", "refunds": []}),
        ]
    }

    fn one(steps: Vec<Step>) -> Vec<String> {
        // `id` is the one order the buyer was answered 202 for.
        let id = Uuid::nil();
        let accepted = HashSet::from([id]);
        check(&BTreeMap::from([(id, steps)]), &accepted, 0, &books())
    }

    #[test]
    fn the_paths_the_model_allows_pass() {
        let placed = || step(1, "order.placed", json!({"total_minor": 100}));
        assert!(one(vec![
            placed(),
            step(2, "order.confirmed", json!({"payment_id": "pay_ok"}))
        ])
        .is_empty());
        assert!(one(vec![
            placed(),
            step(2, "order.expired", json!({})),
            step(
                3,
                "order.confirmed",
                json!({"payment_id": "pay_ok", "reactivated": true})
            ),
            step(4, "order.refund_decided", json!({"payment_id": "pay_late"})),
            step(5, "order.refunded", json!({"payment_id": "pay_late"})),
        ])
        .is_empty());
        assert!(one(vec![
            placed(),
            step(2, "order.payment_failed", json!({"payment_id": "pay_no"}))
        ])
        .is_empty());
        // Authorized, captured as it shipped; a late authorization voided.
        assert!(one(vec![
            placed(),
            step(
                2,
                "order.confirmed",
                json!({"payment_id": "pay_ok", "uncaptured": true})
            ),
            step(
                3,
                "order.refund_decided",
                json!({"payment_id": "pay_void", "void": true})
            ),
            step(4, "order.capture_decided", json!({"payment_id": "pay_ok"})),
            step(
                5,
                "order.refunded",
                json!({"payment_id": "pay_void", "void": true})
            ),
            step(6, "order.captured", json!({"payment_id": "pay_ok"})),
        ])
        .is_empty());
    }

    #[test]
    fn each_move_the_model_forbids_is_named() {
        let placed = || step(1, "order.placed", json!({"total_minor": 100}));
        let cases = [
            (vec![placed()], "still pending"),
            (
                vec![
                    placed(),
                    step(2, "order.cancelled", json!({})),
                    step(3, "order.confirmed", json!({"payment_id": "pay_ok"})),
                ],
                "not a move",
            ),
            (
                vec![
                    placed(),
                    step(2, "order.confirmed", json!({"payment_id": "pay_no"})),
                ],
                "does not hold as succeeded",
            ),
            (
                vec![
                    placed(),
                    step(
                        2,
                        "order.confirmed",
                        json!({"payment_id": "pay_ok", "reactivated": true}),
                    ),
                ],
                "only an expired order",
            ),
            (
                vec![
                    placed(),
                    step(2, "order.confirmed", json!({"payment_id": "pay_ok"})),
                    step(3, "order.refund_decided", json!({"payment_id": "pay_ok"})),
                ],
                "stands on",
            ),
            (
                vec![
                    placed(),
                    step(2, "order.cancelled", json!({})),
                    step(3, "order.refunded", json!({"payment_id": "pay_late"})),
                ],
                "no refund decided",
            ),
            (
                vec![
                    placed(),
                    step(2, "order.cancelled", json!({})),
                    step(3, "order.refund_decided", json!({"payment_id": "pay_ok"})),
                    step(4, "order.refunded", json!({"payment_id": "pay_ok"})),
                ],
                "not at the PSP",
            ),
            (vec![], "none of its events"),
            (
                vec![
                    placed(),
                    step(
                        2,
                        "order.confirmed",
                        json!({"payment_id": "pay_ok", "uncaptured": true}),
                    ),
                ],
                "never ended captured",
            ),
            (
                vec![
                    placed(),
                    step(
                        2,
                        "order.confirmed",
                        json!({"payment_id": "pay_ok", "uncaptured": true}),
                    ),
                    step(3, "order.capture_decided", json!({"payment_id": "pay_ok"})),
                    step(4, "order.capture_decided", json!({"payment_id": "pay_ok"})),
                ],
                "twice",
            ),
            (
                vec![
                    placed(),
                    step(2, "order.cancelled", json!({})),
                    step(
                        3,
                        "order.refund_decided",
                        json!({"payment_id": "pay_ok", "void": true}),
                    ),
                    step(
                        4,
                        "order.refunded",
                        json!({"payment_id": "pay_ok", "void": true}),
                    ),
                ],
                "voided in the trace, not at the PSP",
            ),
        ];
        for (steps, named) in cases {
            let faults = one(steps);
            assert!(
                faults.iter().any(|f| f.contains(named)),
                "{named}: {faults:?}"
            );
        }
    }

    #[test]
    fn orders_never_answered_202_are_at_most_the_unanswered_requests() {
        let traces: BTreeMap<Uuid, Vec<Step>> = (0..2)
            .map(|i| {
                let steps = vec![
                    step(1, "order.placed", json!({"total_minor": 100})),
                    step(2, "order.expired", json!({})),
                ];
                (Uuid::from_u128(i), steps)
            })
            .collect();
        assert!(check(&traces, &HashSet::new(), 2, &books()).is_empty());
        let faults = check(&traces, &HashSet::new(), 1, &books());
        assert!(
            faults[0].contains("only 1 requests went unanswered"),
            "{faults:?}"
        );
    }
}
