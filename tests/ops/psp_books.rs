//! The payment provider's books survive the provider being killed: every
//! payment and refund is still there after a SIGKILL and a restart, and the
//! saga carries on without a double charge.

use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, psp_listing};
use soldonce_tests::system::System;
use std::collections::BTreeMap;
use std::time::Duration;
use uuid::Uuid;

/// Every payment the PSP lists, by id, with its refunds' ids.
async fn psp_books(system: &System) -> BTreeMap<String, Vec<String>> {
    psp_listing(&system.app, &system.url("psp-sim"), "payments")
        .await
        .iter()
        .map(|p| {
            let refunds = p["refunds"]
                .as_array()
                .expect("refunds")
                .iter()
                .map(|r| r["id"].as_str().unwrap_or("").to_owned())
                .collect();
            (p["id"].as_str().expect("id").to_owned(), refunds)
        })
        .collect()
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
    // Three payments made on the account by someone else (keys soldonce
    // never uses), each refunded by its maker: soldonce leaves them alone.
    for id in &first[..3] {
        let body = serde_json::json!({ "amount_minor": 2500, "currency": "BRL", "reference": id });
        let request = system
            .app
            .client
            .post(format!("{}/v1/payments", system.url("psp-sim")))
            .header("idempotency-key", format!("again:{id}"))
            .json(&body);
        let created = system.app.send(request).await;
        assert_eq!(created.status, 201, "{}", created.body);
        let payment = created.body["id"].as_str().expect("payment id");
        let refund = system
            .app
            .client
            .post(format!(
                "{}/v1/payments/{payment}/refunds",
                system.url("psp-sim")
            ))
            .header("idempotency-key", format!("refund-again:{id}"))
            .json(&serde_json::json!({}));
        let refunded = system.app.send(refund).await;
        assert!((200..300).contains(&refunded.status), "{}", refunded.body);
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_worker_and_fulfillment_sigkilled_mid_batch_lose_nothing_and_double_nothing() {
    let mut system = System::start().await;
    // Large batches, so each kill lands in the middle of some.
    for service in ["payment-worker", "fulfillment"] {
        system
            .env
            .get_mut(service)
            .expect("service env")
            .insert("CONSUMER_BATCH_SIZE", "64".to_owned());
        system.kill(service).await;
        system.launch(service).await;
    }
    system.app.add_product("MUG", 2500, 10_000).await;
    let placing = {
        let (client, token, url) = (
            system.app.client.clone(),
            system.app.token.clone(),
            system.url("checkout"),
        );
        tokio::spawn(async move {
            futures::future::join_all((0..8).map(|_| {
                let (client, token, url) = (client.clone(), token.clone(), url.clone());
                async move {
                    let mut ids = vec![];
                    for _ in 0..75 {
                        let placed = client
                            .post(format!("{url}/v1/orders"))
                            .bearer_auth(&token)
                            .header("idempotency-key", Uuid::new_v4().to_string())
                            .json(
                                &serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] }),
                            )
                            .send()
                            .await
                            .expect("checkout answers");
                        assert_eq!(placed.status(), 202);
                        let body: serde_json::Value = placed.json().await.expect("json");
                        ids.push(body["id"].as_str().expect("id").to_owned());
                    }
                    ids
                }
            }))
            .await
        })
    };
    for (service, table) in [("payment-worker", "payments"), ("fulfillment", "shipments")] {
        eventually(
            &format!("{service} to be at work"),
            Duration::from_secs(60),
            || async {
                (system
                    .app
                    .count(&format!("SELECT count(*) FROM {table}"))
                    .await
                    >= 50)
                    .then_some(())
            },
        )
        .await;
        system.kill(service).await;
        system.launch(service).await;
    }
    let placed: Vec<String> = placing.await.expect("placing").concat();
    assert_eq!(placed.len(), 600);
    wait_count(
        &system,
        "every shipment to be delivered",
        "SELECT count(*) FROM shipments WHERE state = 'delivered'",
        600,
    )
    .await;
    let books = psp_books(&system).await;
    assert_eq!(books.len(), 600, "the PSP charged each order once");
    assert!(books.values().all(|r| r.is_empty()), "nothing refunded");
    for (what, sql) in [
        (
            "confirmed orders",
            "SELECT count(*) FROM orders WHERE state = 'confirmed'",
        ),
        (
            "attached payments",
            "SELECT count(*) FROM payments WHERE disposition = 'attached'",
        ),
        (
            "confirmations",
            "SELECT count(*) FROM events WHERE type = 'order.confirmed.v1'",
        ),
        (
            "shipments created",
            "SELECT count(*) FROM events WHERE type = 'shipment.created.v1'",
        ),
        (
            "units sold",
            "SELECT sold FROM stock_sold WHERE sku = 'MUG'",
        ),
    ] {
        assert_eq!(system.app.count(sql).await, 600, "{what}");
    }
    assert_audit_clean(&system.app).await;
}
