//! The payment provider's books survive the provider being killed: every
//! payment and refund is still there after a SIGKILL and a restart, and the
//! saga carries on without a double charge.

use soldonce_tests::eventually;
use soldonce_tests::saga::assert_audit_clean;
use soldonce_tests::system::System;
use std::collections::BTreeMap;
use std::time::Duration;
use uuid::Uuid;

/// Every payment the PSP lists, by id, with its refunds' ids.
async fn psp_books(system: &System) -> BTreeMap<String, Vec<String>> {
    let mut books = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut request = system
            .app
            .client
            .get(format!("{}/v1/payments", system.url("psp-sim")))
            .query(&[("limit", "100")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let page = system.app.send(request).await;
        assert_eq!(page.status, 200, "{}", page.body);
        for p in page.body["data"].as_array().expect("data") {
            let refunds = p["refunds"]
                .as_array()
                .expect("refunds")
                .iter()
                .map(|r| r["id"].as_str().unwrap_or("").to_owned())
                .collect();
            books.insert(p["id"].as_str().expect("id").to_owned(), refunds);
        }
        match (
            page.body["has_more"].as_bool(),
            page.body["next_cursor"].as_str(),
        ) {
            (Some(true), Some(next)) => cursor = Some(next.to_owned()),
            _ => return books,
        }
    }
}

async fn place(system: &System, n: usize) -> Vec<String> {
    let mut ids = vec![];
    for _ in 0..n {
        let body = serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] });
        let key = Uuid::new_v4().to_string();
        let request = system
            .app
            .client
            .post(format!("{}/v1/orders", system.url("checkout")))
            .bearer_auth(&system.app.token)
            .header("idempotency-key", key)
            .json(&body);
        let placed = system.app.send(request).await;
        assert_eq!(placed.status, 202, "{}", placed.body);
        ids.push(placed.body["id"].as_str().expect("id").to_owned());
    }
    ids
}

async fn wait_count(system: &System, what: &str, sql: &str, want: i64) {
    eventually(what, Duration::from_secs(60), || async {
        (system.app.count(sql).await == want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psp_sim_killed_mid_run_keeps_every_payment_and_refund() {
    let mut system = System::start().await;
    system.app.add_product("MUG", 2500, 100).await;
    let first = place(&system, 10).await;
    wait_count(
        &system,
        "the first orders to be paid",
        "SELECT count(*) FROM orders WHERE state = 'confirmed'",
        10,
    )
    .await;
    // A second charge of three orders: soldonce refunds each.
    for id in &first[..3] {
        let body = serde_json::json!({ "amount_minor": 2500, "currency": "BRL", "reference": id });
        let request = system
            .app
            .client
            .post(format!("{}/v1/payments", system.url("psp-sim")))
            .header("idempotency-key", format!("again:{id}"))
            .json(&body);
        assert_eq!(system.app.send(request).await.status, 201);
    }
    wait_count(
        &system,
        "the second charges to be refunded",
        "SELECT count(*) FROM payments WHERE refund_state = 'succeeded'",
        3,
    )
    .await;
    let before = psp_books(&system).await;
    assert_eq!(
        (
            before.len(),
            before.values().filter(|r| !r.is_empty()).count()
        ),
        (13, 3)
    );

    system.kill("psp-sim").await;
    // Orders keep coming while the provider is down; the worker retries by key.
    let second = place(&system, 10).await;
    system.launch("psp-sim").await;
    wait_count(
        &system,
        "every order to be paid",
        "SELECT count(*) FROM orders WHERE state = 'confirmed'",
        20,
    )
    .await;

    let after = psp_books(&system).await;
    for (payment, refunds) in &before {
        assert_eq!(
            after.get(payment),
            Some(refunds),
            "payment {payment} and its refunds survived the kill"
        );
    }
    assert_eq!(
        after.len(),
        23,
        "one charge per order, plus the three second charges"
    );
    for id in first.iter().chain(&second) {
        let r = system
            .app
            .send(
                system
                    .app
                    .client
                    .get(format!("{}/v1/payments", system.url("psp-sim")))
                    .query(&[("reference", id.as_str())]),
            )
            .await;
        let charges = r.body["payments"].as_array().map(Vec::len).unwrap_or(0);
        assert_eq!(
            charges,
            if first[..3].contains(id) { 2 } else { 1 },
            "order {id}"
        );
    }
    assert_audit_clean(&system.app).await;
}
