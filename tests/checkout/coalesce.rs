//! Coalesced reservations: many placements per transaction, each request
//! still answered on its own. Which requests shared a transaction is read
//! from PostgreSQL itself (`xmin`, the inserting transaction of a row), so
//! the tests see the grouping independently of checkout's own account.

use futures::stream::{self, StreamExt};
use soldonce_tests::app::{Buckets, Reply};
use soldonce_tests::relay::binary;
use soldonce_tests::{eventually, servers, TestApp};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

fn one(sku: &str) -> serde_json::Value {
    serde_json::json!({ "lines": [{ "sku": sku, "quantity": 1 }] })
}

/// Rows of `table` and the transactions that inserted them.
async fn rows_and_transactions(app: &TestApp, table: &str) -> (i64, i64) {
    (
        app.count(&format!("SELECT count(*) FROM {table}")).await,
        app.count(&format!("SELECT count(DISTINCT xmin::text) FROM {table}"))
            .await,
    )
}

/// A checkout over `database_url` configured by `configure`.
async fn checkout(
    database_url: &str,
    configure: impl FnOnce(&mut checkout::Settings),
) -> Arc<TestApp> {
    Arc::new(
        TestApp::spawn_configured(database_url.to_owned(), Duration::from_secs(900), configure)
            .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_of_a_hot_sku_are_committed_in_groups_and_sold_exactly_the_stock() {
    let app = Arc::new(TestApp::spawn().await);
    sell_a_hot_sku_in_groups(app).await;
}

/// The same with the lanes on a thread of their own (`CHECKOUT_COALESCE_THREAD=own`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_on_a_thread_of_their_own_sell_a_hot_sku_in_groups_exactly_once() {
    let db = servers::fresh_database().await;
    sell_a_hot_sku_in_groups(checkout(&db, |s| s.coalesce.own_thread = true).await).await;
}

/// 1,000 buyers, 300 at a time, of a SKU with 300 units: 300 orders, 700
/// refusals, committed in groups, every unit and key accounted for.
async fn sell_a_hot_sku_in_groups(app: Arc<TestApp>) {
    app.add_product("HOT", 1000, 300).await;
    let statuses: Vec<u16> = stream::iter(0..1_000)
        .map(|_| {
            let app = app.clone();
            async move { app.buy_retrying("HOT", 1).await.status }
        })
        .buffer_unordered(300)
        .collect()
        .await;
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    assert_eq!(
        (accepted, statuses.iter().filter(|s| **s == 409).count()),
        (300, 700)
    );
    let (orders, order_transactions) = rows_and_transactions(&app, "orders").await;
    assert_eq!(orders, 300, "order rows");
    let (keys, key_transactions) = rows_and_transactions(&app, "idempotency_keys").await;
    assert_eq!(keys, 1_000, "every answer is stored under its key");
    assert!(
        order_transactions < orders && key_transactions * 2 <= keys,
        "coalesced: {orders} orders in {order_transactions} transactions, {keys} keys in {key_transactions}"
    );
    assert_eq!(
        app.buckets("HOT").await,
        Buckets {
            available: 0,
            reserved: 300,
            sold: 0
        }
    );
    assert_eq!(app.ledger("HOT").await, app.buckets("HOT").await);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'order.placed.v1'")
            .await,
        300,
        "one OrderPlaced per order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_coalescing_off_every_placement_has_a_transaction_of_its_own() {
    let db = servers::fresh_database().await;
    let app = checkout(&db, |s| s.coalesce.enabled = false).await;
    for round in 0..3 {
        let sku = format!("LAST-{round}");
        app.add_product(&sku, 1000, 1).await;
        let statuses: Vec<u16> = stream::iter(0..300)
            .map(|_| {
                let (app, sku) = (app.clone(), sku.clone());
                async move { app.buy_retrying(&sku, 1).await.status }
            })
            .buffer_unordered(300)
            .collect()
            .await;
        assert_eq!(
            statuses.iter().filter(|s| **s == 202).count(),
            1,
            "round {round}"
        );
        assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 299);
    }
    let (keys, transactions) = rows_and_transactions(&app, "idempotency_keys").await;
    assert_eq!((keys, transactions), (900, 900), "one transaction per key");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_aborted_to_break_a_deadlock_is_run_again_and_every_buyer_gets_one_order() {
    let db = servers::fresh_database().await;
    let app = checkout(&db, |_| {}).await;
    app.add_product("MUG", 1000, 100).await;
    // PostgreSQL breaks a deadlock by aborting one transaction with 40P01.
    // Here the first two transactions holding the unlucky order are aborted
    // so (a sequence is not rolled back with them, so it counts the tries).
    for statement in [
        "CREATE SEQUENCE deadlock_tries",
        "CREATE FUNCTION deadlock_twice() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.shipping->>'name' = 'UNLUCKY' THEN IF nextval('deadlock_tries') <= 2 THEN \
         RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END IF; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER deadlock_twice BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION deadlock_twice()",
    ] {
        sqlx::query(statement)
            .execute(&app.pool)
            .await
            .expect("install the deadlock trigger");
    }
    let replies: Vec<Reply> = stream::iter(0..20)
        .map(|i| {
            let app = app.clone();
            async move {
                let mut body = one("MUG");
                if i == 10 {
                    body["shipping"] = serde_json::json!({
                        "name": "UNLUCKY", "line1": "1 Main St", "city": "Porto Alegre",
                        "postal_code": "90000", "country": "BR"
                    });
                }
                app.place(&app.token, &Uuid::new_v4().to_string(), &body)
                    .await
            }
        })
        .buffer_unordered(20)
        .collect()
        .await;
    for reply in &replies {
        assert_eq!(reply.status, 202, "{}", reply.body);
    }
    let tries: i64 = sqlx::query_scalar("SELECT last_value FROM deadlock_tries")
        .fetch_one(&app.pool)
        .await
        .expect("tries");
    assert_eq!(tries, 3, "aborted twice, committed on the third run");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 20);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE shipping->>'name' = 'UNLUCKY'")
            .await,
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 20);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 80,
            reserved: 20,
            sold: 0
        }
    );
    assert_eq!(app.ledger("MUG").await, app.buckets("MUG").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_placement_never_fails_the_others_in_its_group() {
    let db = servers::fresh_database().await;
    // One lane and small groups: many groups, only one of them poisoned.
    let app = checkout(&db, |s| {
        s.coalesce.lanes = 1;
        s.coalesce.max_group = 16;
    })
    .await;
    app.add_product("MUG", 1000, 1_000).await;
    // A placement the database refuses, as a bug or a bad row would make it.
    for statement in [
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.shipping->>'name' = 'POISON' THEN RAISE EXCEPTION 'poisoned order'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    ] {
        sqlx::query(statement)
            .execute(&app.pool)
            .await
            .expect("install the poison trigger");
    }
    // One of 300, so the other groups commit whole and the grouping stays visible.
    let poisoned = |i: usize| i == 150;
    let replies: Vec<(usize, String, Reply)> = stream::iter(0..300)
        .map(|i| {
            let app = app.clone();
            async move {
                let mut body = one("MUG");
                if poisoned(i) {
                    body["shipping"] = serde_json::json!({
                        "name": "POISON", "line1": "1 Main St", "city": "Porto Alegre",
                        "postal_code": "90000", "country": "BR"
                    });
                }
                let key = Uuid::new_v4().to_string();
                let reply = app.place_retrying(&app.token, &key, &body).await;
                (i, key, reply)
            }
        })
        .buffer_unordered(300)
        .collect()
        .await;
    for (i, key, reply) in &replies {
        if poisoned(*i) {
            reply.assert_problem(500);
            assert_eq!(
                app.count(&format!(
                    "SELECT count(*) FROM idempotency_keys WHERE key = '{key}'"
                ))
                .await,
                0,
                "a failed placement stores nothing under its key"
            );
        } else {
            assert_eq!(reply.status, 202, "request {i}: {}", reply.body);
        }
    }
    let (orders, transactions) = rows_and_transactions(&app, "orders").await;
    assert_eq!(orders, 299, "every good order placed");
    assert!(
        transactions < orders,
        "the good orders were grouped: {orders} in {transactions} transactions"
    );
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 701,
            reserved: 299,
            sold: 0
        }
    );
    assert_eq!(app.ledger("MUG").await, app.buckets("MUG").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_racing_requests_with_one_key_make_one_order_within_and_across_groups() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("MUG", 2500, 100).await;
    for round in 0..5 {
        let key = format!("race-{round}");
        let replies: Vec<Reply> = stream::iter(0..20)
            .map(|_| {
                let (app, key) = (app.clone(), key.clone());
                async move { app.place(&app.token, &key, &one("MUG")).await }
            })
            .buffer_unordered(20)
            .collect()
            .await;
        let mut ids = HashSet::new();
        for r in &replies {
            match r.status {
                202 => {
                    ids.insert(r.body["id"].as_str().expect("id").to_owned());
                }
                409 => assert_eq!(
                    r.body["type"], "urn:soldonce:problem:idempotency-key-in-flight",
                    "round {round}"
                ),
                s => panic!("round {round}: unexpected {s}: {}", r.body),
            }
        }
        assert_eq!(ids.len(), 1, "round {round}: every 202 names one order");
        let other = app
            .place(
                &app.token,
                &key,
                &serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 2 }] }),
            )
            .await;
        other.assert_problem(422);
    }
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 5);
    assert_eq!(app.buckets("MUG").await.reserved, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_checkout_instances_on_one_database_sell_the_last_unit_once_and_share_keys() {
    let db = servers::fresh_database().await;
    let a = checkout(&db, |_| {}).await;
    let b = checkout(&db, |_| {}).await;
    let instances = [a.clone(), b.clone()];
    for round in 0..10 {
        let sku = format!("LAST-{round}");
        a.add_product(&sku, 1000, 1).await;
        let statuses: Vec<u16> = stream::iter(0..300)
            .map(|i| {
                // Both instances share the database, so a's token is valid on either.
                let (app, sku, token) = (instances[i % 2].clone(), sku.clone(), a.token.clone());
                async move {
                    let body = one(&sku);
                    app.place_retrying(&token, &Uuid::new_v4().to_string(), &body)
                        .await
                        .status
                }
            })
            .buffer_unordered(300)
            .collect()
            .await;
        assert_eq!(
            (
                statuses.iter().filter(|s| **s == 202).count(),
                statuses.iter().filter(|s| **s == 409).count()
            ),
            (1, 299),
            "round {round}"
        );
        assert_eq!(
            a.buckets(&sku).await,
            Buckets {
                available: 0,
                reserved: 1,
                sold: 0
            },
            "round {round}"
        );
    }
    // One key raced on both instances: one order.
    a.add_product("MUG", 2500, 100).await;
    let replies: Vec<Reply> = stream::iter(0..20)
        .map(|i| {
            let app = instances[i % 2].clone();
            let token = a.token.clone();
            async move { app.place(&token, "shared", &one("MUG")).await }
        })
        .buffer_unordered(20)
        .collect()
        .await;
    let ids: HashSet<&str> = replies
        .iter()
        .filter(|r| r.status == 202)
        .map(|r| r.body["id"].as_str().expect("id"))
        .collect();
    assert!(replies.iter().all(|r| r.status == 202 || r.status == 409));
    assert_eq!(ids.len(), 1, "every 202 names one order");
    assert_eq!(
        a.count("SELECT count(*) FROM order_lines WHERE sku = 'MUG'")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_killed_mid_load_answered_202_only_for_committed_orders() {
    let app = TestApp::spawn().await;
    app.add_product("HOT", 1000, 1_000_000).await;
    let port = localservers::free_port().expect("port");
    let base = format!("http://127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(binary("checkout"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", &app.database_url)
        .env("CHECKOUT_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start checkout");
    soldonce_tests::poll::ready("checkout", &format!("{base}/readyz")).await;
    let client = reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .expect("http client");

    // 200 buyers in a closed loop until the process dies under them.
    let answers: Arc<std::sync::Mutex<HashMap<String, Option<Reply>>>> = Arc::default();
    let buyers: Vec<_> = (0..200)
        .map(|_| {
            let (client, base, token, answers) = (
                client.clone(),
                base.clone(),
                app.token.clone(),
                answers.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let key = Uuid::new_v4().to_string();
                    answers.lock().expect("answers").insert(key.clone(), None);
                    let sent = client
                        .post(format!("{base}/v1/orders"))
                        .bearer_auth(&token)
                        .header("idempotency-key", &key)
                        .json(&one("HOT"))
                        .send()
                        .await;
                    let Ok(response) = sent else { return };
                    let status = response.status().as_u16();
                    let Ok(body) = response.json::<serde_json::Value>().await else {
                        return;
                    };
                    let reply = Reply {
                        status,
                        headers: Default::default(),
                        body,
                    };
                    answers.lock().expect("answers").insert(key, Some(reply));
                }
            })
        })
        .collect();
    eventually("orders to flow", Duration::from_secs(60), || async {
        (app.count("SELECT count(*) FROM orders").await >= 2_000).then_some(())
    })
    .await;
    child.kill().await.expect("SIGKILL checkout");
    for b in buyers {
        b.await.expect("buyer");
    }

    let answers = answers.lock().expect("answers").clone();
    let accepted: HashMap<&str, &str> = answers
        .iter()
        .filter_map(|(key, reply)| {
            let r = reply.as_ref().filter(|r| r.status == 202)?;
            Some((key.as_str(), r.body["id"].as_str()?))
        })
        .collect();
    assert!(!accepted.is_empty(), "the load ran before the kill");
    // Every 202 has its order, its event and its key.
    let stored: Vec<(String, Uuid)> = sqlx::query_as(
        "SELECT k.key, o.id FROM idempotency_keys k JOIN orders o ON o.id = k.order_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("keys");
    let stored: HashMap<String, Uuid> = stored.into_iter().collect();
    for (key, id) in &accepted {
        assert_eq!(
            stored.get(*key).map(|u| u.to_string()).as_deref(),
            Some(*id),
            "an accepted order is stored under its key"
        );
    }
    let orders = app.count("SELECT count(*) FROM orders").await;
    assert_eq!(
        orders as usize,
        stored.len(),
        "every order has the key it was placed under"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'order.placed.v1'")
            .await,
        orders
    );
    // Orders whose request got no 202 (the answer was lost with the
    // process) are replayable: the key answers 202 with that very order.
    let unanswered: Vec<(&String, &Uuid)> = stored
        .iter()
        .filter(|(key, _)| !accepted.contains_key(key.as_str()))
        .collect();
    // Only the groups in flight when the process died can have lost their answers.
    let in_flight = checkout::Coalesce::default();
    assert!(
        unanswered.len() <= in_flight.lanes * in_flight.max_group,
        "{} committed orders got no 202",
        unanswered.len()
    );
    for (key, id) in &unanswered {
        assert!(
            answers.contains_key(*key),
            "an order exists for a key no buyer sent"
        );
        let replay = app.place(&app.token, key, &one("HOT")).await;
        assert_eq!(replay.status, 202, "{}", replay.body);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body["id"], id.to_string());
    }
    let b = app.buckets("HOT").await;
    assert_eq!(b.reserved, orders, "reserved units equal the orders");
    assert_eq!(b.available + b.reserved, 1_000_000, "no unit lost");
    assert_eq!(app.ledger("HOT").await, b);
}

/// With `CHECKOUT_COALESCE_THREAD=own` the lanes run on a thread of their
/// own: a group's transaction ends (and a hot SKU's row is released) while
/// checkout's request threads are all busy. Here the only request thread is blocked for 5 s while a group's
/// statement runs; the order is committed long before it is free again,
/// seen from a thread and a connection of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_group_commits_while_every_request_thread_is_busy() {
    let db = servers::fresh_database().await;
    let app = checkout(&db, |s| s.coalesce.own_thread = true).await;
    app.add_product("SLOW", 1000, 10).await;
    // The group's statement takes 0.4 s, time to block the request thread while it runs.
    for statement in [
        "CREATE FUNCTION slow_order() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(0.4); RETURN NEW; END $$",
        "CREATE TRIGGER slow_order BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION slow_order()",
    ] {
        sqlx::query(statement)
            .execute(&app.pool)
            .await
            .expect("slow trigger");
    }
    let buyer = tokio::spawn({
        let app = app.clone();
        async move { app.buy("SLOW", 1).await.status }
    });
    eventually("the group's statement to run", Duration::from_secs(30), || {
        let app = app.clone();
        async move {
            (app.count(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'WITH keyed%'",
            )
            .await
                > 0)
            .then_some(())
        }
    })
    .await;
    // Occupies the runtime's only worker: a task that blocks it.
    tokio::spawn(async { std::thread::sleep(Duration::from_secs(5)) });
    let url = app.database_url.clone();
    let committed_after = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("observer runtime");
        runtime.block_on(async move {
            let pool = sqlx::PgPool::connect(&url).await.expect("observer pool");
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(4) {
                let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(&pool)
                    .await
                    .expect("count orders");
                if orders == 1 {
                    return Some(started.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        })
    })
    .join()
    .expect("observer");
    assert!(
        committed_after.is_some(),
        "the group's transaction waited for the busy request thread to commit"
    );
    assert_eq!(buyer.await.expect("buyer"), 202);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}
