//! Idempotency-Key behaviour per the IETF draft, scoped per account.

use serde_json::json;
use soldonce_tests::app::Buckets;
use soldonce_tests::TestApp;
use std::sync::Arc;

fn one(sku: &str, quantity: i64) -> serde_json::Value {
    json!({ "lines": [{ "sku": sku, "quantity": quantity }] })
}

#[tokio::test]
async fn a_retry_with_the_same_key_and_body_gets_the_same_answer_and_moves_stock_once() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let first = app.place(&app.token, "key-1", &one("MUG", 2)).await;
    let second = app.place(&app.token, "key-1", &one("MUG", 2)).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(second.status, 202);
    assert_eq!(first.body, second.body, "the same body");
    assert_eq!(first.header("location"), second.header("location"));
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 8,
            reserved: 2,
            sold: 0
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM stock_ledger WHERE movement = 'reserve'")
            .await,
        1
    );
}

#[tokio::test]
async fn an_out_of_stock_answer_is_replayed_too() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 1).await;
    let first = app.place(&app.token, "k", &one("MUG", 2)).await;
    first.assert_problem(409);
    app.add_product("OTHER", 1, 0).await;
    store::catalog::receive(&app.pool, &domain::Sku::parse("MUG").expect("sku"), 5)
        .await
        .expect("receive");
    let retry = app.place(&app.token, "k", &one("MUG", 2)).await;
    assert_eq!(
        (retry.status, &retry.body),
        (409, &first.body),
        "the stored answer, not a new attempt"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_racing_retries_make_exactly_one_order() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("MUG", 2500, 100).await;
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.place(&app.token, "race", &one("MUG", 1)).await })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let r = t.await.expect("task");
        match r.status {
            202 => {
                ids.insert(r.body["id"].as_str().expect("id").to_owned());
            }
            409 => assert_eq!(
                r.body["type"],
                "urn:soldonce:problem:idempotency-key-in-flight"
            ),
            s => panic!("unexpected {s}: {}", r.body),
        }
    }
    assert_eq!(ids.len(), 1, "every 202 names the same order");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.buckets("MUG").await.reserved, 1);
}

#[tokio::test]
async fn the_same_key_with_a_different_body_is_422() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    assert_eq!(app.place(&app.token, "k", &one("MUG", 1)).await.status, 202);
    let other = app.place(&app.token, "k", &one("MUG", 3)).await;
    other.assert_problem(422);
    assert_eq!(
        other.body["type"],
        "urn:soldonce:problem:idempotency-key-reused"
    );
    assert_eq!(app.buckets("MUG").await.reserved, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_while_the_first_is_in_flight_is_409() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("MUG", 2500, 10).await;
    // Hold the stock row so the first request stops at its reservation.
    let (blocker, blocker_pid) = app.hold_stock_row("MUG").await;
    let first = {
        let app = app.clone();
        tokio::spawn(async move { app.place(&app.token, "slow", &one("MUG", 1)).await })
    };
    app.wait_blocked_by(blocker_pid, "the first request to wait on the stock row")
        .await;
    let second = app.place(&app.token, "slow", &one("MUG", 1)).await;
    second.assert_problem(409);
    assert_eq!(
        second.body["type"],
        "urn:soldonce:problem:idempotency-key-in-flight"
    );
    blocker.rollback().await.expect("release");
    let first = first.await.expect("task");
    assert_eq!(first.status, 202);
    let third = app.place(&app.token, "slow", &one("MUG", 1)).await;
    assert_eq!((third.status, &third.body), (202, &first.body));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn the_same_key_from_another_account_is_an_independent_request() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let (_, other) = app.new_account("someone else").await;
    let mine = app.place(&app.token, "shared-key", &one("MUG", 1)).await;
    let theirs = app.place(&other, "shared-key", &one("MUG", 1)).await;
    assert_eq!((mine.status, theirs.status), (202, 202));
    assert_ne!(mine.body["id"], theirs.body["id"]);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 2);
    assert_eq!(app.buckets("MUG").await.reserved, 2);
}

#[tokio::test]
async fn a_missing_key_is_400_and_changes_nothing() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let r = app
        .send(
            app.client
                .post(app.url("/v1/orders"))
                .bearer_auth(&app.token)
                .json(&one("MUG", 1)),
        )
        .await;
    r.assert_problem(400);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 10,
            reserved: 0,
            sold: 0
        }
    );
}

/// A stock row held by a stuck connection (a transaction that never ends)
/// does not hold a buyer for ever: checkout's `lock_timeout` turns the wait
/// into `503` with `Retry-After`, nothing is reserved, and the same key
/// places the order once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_by_a_stuck_connection_is_a_503_to_retry_with_the_same_key() {
    let app = TestApp::spawn().await;
    app.add_product("STUCK", 2500, 10).await;
    let mut stuck = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM stock WHERE sku = 'STUCK' FOR UPDATE")
        .execute(&mut *stuck)
        .await
        .expect("hold the row");
    let started = std::time::Instant::now();
    let held = app.place(&app.token, "stuck-1", &one("STUCK", 1)).await;
    assert_eq!(held.status, 503, "{}", held.body);
    assert!(held.header("retry-after").is_some(), "{:?}", held.headers);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "answered within the lock timeouts, not never"
    );
    stuck
        .rollback()
        .await
        .expect("the stuck connection goes away");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    let placed = app.place(&app.token, "stuck-1", &one("STUCK", 1)).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.buckets("STUCK").await.reserved, 1);
}

/// Placements waiting for a lane in this test process (every checkout's).
async fn queued(app: &TestApp) -> f64 {
    soldonce_tests::metric_sample(&app.metrics().await, "soldonce_checkout_queued_placements")
        .unwrap_or(0.0)
}

/// A key repeated inside one coalesced group is compared with the key's
/// stored request, as if each request had come in a group of its own: after
/// `K` was stored for body A, a group holding K with bodies B and A (in
/// any order) answers every B 422 and every A the stored 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_repeated_in_one_group_is_compared_with_its_stored_request() {
    let app = Arc::new(
        TestApp::spawn_configured(
            soldonce_tests::servers::fresh_database().await,
            std::time::Duration::from_secs(900),
            |s| s.coalesce.lanes = 1,
        )
        .await,
    );
    app.add_product("MUG", 2500, 100).await;
    app.add_product("BLOCK", 100, 10).await;
    let (a, b) = (one("MUG", 1), one("MUG", 2));
    let stored = app.place(&app.token, "K", &a).await;
    assert_eq!(stored.status, 202, "{}", stored.body);
    for round in 0..3 {
        // The only lane waits on a row another transaction holds, so the
        // requests below queue up and are taken as one group.
        let (held, pid) = app.hold_stock_row("BLOCK").await;
        let blocker = {
            let app = app.clone();
            tokio::spawn(async move {
                app.place(&app.token, &format!("block-{round}"), &one("BLOCK", 1))
                    .await
            })
        };
        app.wait_blocked_by(pid, "the lane to wait on BLOCK").await;
        let before = queued(&app).await;
        let racers: Vec<_> = (0..10)
            .map(|i| {
                let (app, body) = (app.clone(), if i % 2 == 0 { b.clone() } else { a.clone() });
                tokio::spawn(async move { (i % 2 == 0, app.place(&app.token, "K", &body).await) })
            })
            .collect();
        // Best effort (the gauge is the whole process's): give them time to queue.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while queued(&app).await < before + 10.0 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        held.rollback().await.expect("release BLOCK");
        assert_eq!(blocker.await.expect("blocker").status, 202);
        for racer in racers {
            let (is_b, reply) = racer.await.expect("racer");
            if is_b {
                reply.assert_problem(422);
                assert_eq!(
                    reply.body["type"],
                    "urn:soldonce:problem:idempotency-key-reused"
                );
            } else {
                assert_eq!(reply.status, 202, "round {round}: {}", reply.body);
                assert_eq!(reply.body["id"], stored.body["id"], "the stored order");
                assert_eq!(reply.header("idempotent-replayed"), Some("true"));
            }
        }
    }
    assert_eq!(
        app.count("SELECT count(*) FROM order_lines WHERE sku = 'MUG'")
            .await,
        1
    );
    assert_eq!(app.buckets("MUG").await.reserved, 1);
}

#[tokio::test]
async fn a_202_is_replayed_byte_for_byte_from_the_orders_first_event_after_the_order_moved_on() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 1).await;
    let (status, first) = app.place_text(&app.token, "k", &one("MUG", 1)).await;
    assert_eq!(status, 202, "{first}");
    let refused = app.place(&app.token, "refused", &one("MUG", 1)).await;
    refused.assert_problem(409);
    // The 202's body is not stored under its key; the refusal's is.
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'k' AND response_body IS NULL AND order_id IS NOT NULL")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'refused' AND response_body IS NOT NULL")
            .await,
        1
    );
    let id: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    let id = id["id"].as_str().expect("order id").to_owned();
    let cancelled = app
        .post_empty(&app.token, &format!("/v1/orders/{id}/cancel"))
        .await;
    assert!(
        cancelled.status < 300,
        "cancel: {} {}",
        cancelled.status,
        cancelled.body
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE state = 'cancelled'")
            .await,
        1,
        "the order moved on"
    );
    let (status, replayed) = app.place_text(&app.token, "k", &one("MUG", 1)).await;
    assert_eq!(status, 202);
    assert_eq!(
        replayed, first,
        "the answer as it was sent, not the order as it is now"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

/// Placing reads the stored answers of the group's idempotency keys on
/// checkout's long-lived connections. A statement kept prepared would keep
/// a plan made while `idempotency_keys` was empty, which read every stored
/// key at each placing as the table grew. The read runs in a function
/// that plans it at each call: after more than five reads on an empty,
/// analyzed table, a read among 20,000 stored keys reads none of them by
/// scanning and finds exactly the stored one, where the same statement
/// prepared on its own reads them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_of_stored_keys_probes_them_however_the_table_grew() {
    const DIRECT: &str = "PREPARE direct(uuid[], text[]) AS \
        SELECT t.i, k.fingerprint, k.status, k.response_body, k.order_id, e.type, e.data \
        FROM unnest($1, $2) WITH ORDINALITY AS t(a, k, i) \
        JOIN idempotency_keys k ON k.account_id = t.a AND k.key = t.k \
        LEFT JOIN events e ON k.response_body IS NULL AND e.stream_id = k.order_id AND e.version = 1";
    let app = TestApp::spawn().await;
    let pool = soldonce_tests::pool_on_frozen_statistics(
        &app.database_url,
        &["idempotency_keys"],
        &[DIRECT],
    )
    .await;
    let account = app.account_id;
    let read = |keys: Vec<&'static str>| {
        let pool = pool.clone();
        async move {
            let accounts = vec![account; keys.len()];
            let found: Vec<(i64,)> = sqlx::query_as(store::placing::KEYS_SQL)
                .bind(&accounts)
                .bind(&keys)
                .fetch_all(&pool)
                .await
                .expect("the stored keys");
            found.into_iter().map(|(i,)| i).collect::<Vec<i64>>()
        }
    };
    for _ in 0..7 {
        assert!(read(vec!["early-1", "early-2"]).await.is_empty());
        sqlx::query(&format!(
            "EXECUTE direct(ARRAY['{account}'::uuid], ARRAY['early-1'])"
        ))
        .execute(&pool)
        .await
        .expect("the direct statement on the empty table");
    }
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, key, fingerprint, status, response_body) \
         SELECT $1, 'old-' || i, '\\x00', 202, '{}' FROM generate_series(1, 20000) i",
    )
    .bind(account)
    .execute(&pool)
    .await
    .expect("the stored keys grow");

    let before = soldonce_tests::rows_scanned(&pool, "idempotency_keys").await;
    let found = read(vec!["new-1", "old-42", "new-2"]).await;
    let scanned = soldonce_tests::rows_scanned(&pool, "idempotency_keys").await - before;
    assert_eq!(found, [2], "exactly the stored key, by its position");
    assert_eq!(scanned, 0, "the read scans no stored key");

    soldonce_tests::assert_kept_plan_scans(
        &pool,
        "idempotency_keys",
        &format!("EXECUTE direct(ARRAY['{account}'::uuid], ARRAY['old-42'])"),
    )
    .await;
}
