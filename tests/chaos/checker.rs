//! An independent checker, in the spirit of Jepsen's: it knows only what
//! the buyers were told (the load's own request history), what a buyer can
//! ask (checkout's public `GET /v1/orders/{id}`) and the PSP's books —
//! never soldonce's tables, audit or projections' SQL. From those alone:
//! every order ends in one terminal state; money adds up to the cent
//! (captured − refunded = the totals of confirmed orders); every payment
//! soldonce created at the PSP (its `pay:` key) is attached to its
//! confirmed order or refunded in full, and every authorization ended
//! captured (its order shipped) or voided, never both; no confirmed order
//! lacks one.

use serde_json::Value;
use soldonce_tests::TestApp;
use std::collections::{BTreeSet, HashMap};
use uuid::Uuid;

/// States an order ends in.
const TERMINAL: [&str; 5] = [
    "confirmed",
    "payment_failed",
    "cancelled",
    "expired",
    "refunded",
];

/// What the checker counted.
#[derive(Debug, Default, serde::Serialize)]
pub struct Verdict {
    pub orders: usize,
    pub confirmed: usize,
    pub captured_minor: i64,
    pub refunded_minor: i64,
    pub confirmed_total_minor: i64,
    /// Authorizations voided (canceled at the PSP): no money moved.
    pub voided: usize,
    /// Payments on the PSP account soldonce did not create (left alone).
    pub foreign_payments: usize,
}

/// One PSP payment, as its books show it.
struct Payment<'a> {
    id: &'a str,
    order: Option<Uuid>,
    /// What the PSP took: the captured amount.
    amount: i64,
    refunded: i64,
    succeeded: bool,
    status: &'a str,
}

fn payment(p: &Value) -> Option<Payment<'_>> {
    let key = p["idempotency_key"].as_str()?;
    let order = key.strip_prefix("pay:")?.parse().ok();
    Some(Payment {
        id: p["id"].as_str()?,
        order,
        amount: p["amount_captured"]
            .as_i64()
            .or_else(|| p["amount_minor"].as_i64())?,
        refunded: p["refunds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["status"] == "succeeded")
            .filter_map(|r| r["amount_minor"].as_i64())
            .sum(),
        succeeded: p["status"] == "succeeded",
        status: p["status"].as_str()?,
    })
}

/// Checks the run; `Err` names every fault found.
pub async fn check(
    app: &TestApp,
    history: &[Value],
    books: &[Value],
) -> Result<Verdict, Vec<String>> {
    let mut faults = vec![];
    let mut verdict = Verdict::default();
    // The orders to ask about: every one answered 202, and every one the PSP was asked to charge.
    let mut ids: BTreeSet<Uuid> = history
        .iter()
        .filter(|r| r["status"] == 202)
        .filter_map(|r| r["order_id"].as_str()?.parse().ok())
        .collect();
    let payments: Vec<Payment> = books.iter().filter_map(payment).collect();
    verdict.foreign_payments = books.len() - payments.len();
    ids.extend(payments.iter().filter_map(|p| p.order));

    let mut orders: HashMap<Uuid, Value> = HashMap::new();
    for id in &ids {
        let r = app.get(&app.token, &format!("/v1/orders/{id}")).await;
        if r.status != 200 {
            faults.push(format!(
                "order {id}: the API answers {} ({})",
                r.status, r.body
            ));
            continue;
        }
        let state = r.body["state"].as_str().unwrap_or("");
        if !TERMINAL.contains(&state) {
            faults.push(format!("order {id} never ended: {state}"));
        }
        orders.insert(*id, r.body);
    }
    verdict.orders = orders.len();

    // Authorizations: each ended captured or voided; a void never settles an order.
    for p in &payments {
        let order = p.order.and_then(|o| orders.get(&o));
        let settles = order.is_some_and(|o| {
            o["state"] == "confirmed" && o["payment"]["psp_payment_id"].as_str() == Some(p.id)
        });
        match p.status {
            "requires_capture" | "requires_action" | "processing" => {
                faults.push(format!("payment {} never ended: {}", p.id, p.status));
            }
            "canceled" if settles => {
                faults.push(format!("payment {} settles its order yet was voided", p.id));
            }
            "canceled" => verdict.voided += 1,
            _ => {}
        }
    }
    // Money: what the PSP kept is what confirmed orders cost.
    for p in payments.iter().filter(|p| p.succeeded) {
        verdict.captured_minor += p.amount;
        verdict.refunded_minor += p.refunded;
        let Some(order) = p.order.and_then(|o| orders.get(&o)) else {
            faults.push(format!("payment {}: its order is unknown", p.id));
            continue;
        };
        let attached = order["state"] == "confirmed"
            && order["payment"]["psp_payment_id"].as_str() == Some(p.id);
        if attached && p.refunded != 0 {
            faults.push(format!(
                "payment {} settles confirmed order {} yet {} was refunded",
                p.id, order["id"], p.refunded
            ));
        }
        if !attached && p.refunded != p.amount {
            faults.push(format!(
                "payment {} ({} minor) is neither attached to its order ({}) nor refunded in full ({} refunded)",
                p.id, p.amount, order["state"], p.refunded
            ));
        }
    }
    for (id, order) in &orders {
        if order["state"] != "confirmed" {
            continue;
        }
        verdict.confirmed += 1;
        let total = order["total_minor"].as_i64().unwrap_or(0);
        verdict.confirmed_total_minor += total;
        let paid = order["payment"]["psp_payment_id"].as_str();
        let held = paid.is_some_and(|pid| payments.iter().any(|p| p.id == pid && p.succeeded));
        if total > 0 && !held {
            faults.push(format!(
                "confirmed order {id} has no succeeded payment of its own at the PSP ({paid:?})"
            ));
        }
    }
    if verdict.captured_minor - verdict.refunded_minor != verdict.confirmed_total_minor {
        faults.push(format!(
            "money: captured {} − refunded {} ≠ {} (the totals of the confirmed orders)",
            verdict.captured_minor, verdict.refunded_minor, verdict.confirmed_total_minor
        ));
    }
    if faults.is_empty() {
        Ok(verdict)
    } else {
        Err(faults)
    }
}
