//! The first promise: the last unit is sold once, however many buyers press "buy".

use futures::stream::{self, StreamExt};
use soldonce_tests::app::Buckets;
use soldonce_tests::eventually;
use soldonce_tests::TestApp;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_buyers_of_the_last_unit_get_one_202_and_299_409s_twenty_times() {
    let app = Arc::new(TestApp::spawn().await);
    for round in 0..20 {
        let sku = format!("TSHIRT-{round}");
        app.add_product(&sku, 4990, 1).await;
        let tasks: Vec<_> = (0..300)
            .map(|_| {
                let (app, sku) = (app.clone(), sku.clone());
                tokio::spawn(async move { app.buy_retrying(&sku, 1).await })
            })
            .collect();
        let mut accepted = 0;
        let mut sold_out = 0;
        for t in tasks {
            let reply = t.await.expect("buyer task");
            match reply.status {
                202 => accepted += 1,
                409 => {
                    assert_eq!(reply.body["sku"], sku.as_str(), "the 409 names the SKU");
                    sold_out += 1;
                }
                other => panic!("round {round}: unexpected {other}: {}", reply.body),
            }
        }
        assert_eq!((accepted, sold_out), (1, 299), "round {round}: responses");
        let orders = app
            .count(&format!(
                "SELECT count(*) FROM order_lines WHERE sku = '{sku}'"
            ))
            .await;
        assert_eq!(orders, 1, "round {round}: order rows");
        assert_eq!(
            app.buckets(&sku).await,
            Buckets {
                available: 0,
                reserved: 1,
                sold: 0
            },
            "round {round}"
        );
        assert_eq!(
            app.ledger(&sku).await,
            app.buckets(&sku).await,
            "round {round}: ledger balances buckets"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_buyers_with_500_in_flight_get_exactly_the_100_units() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("DROP", 1000, 100).await;
    let statuses: Vec<u16> = stream::iter(0..10_000)
        .map(|_| {
            let app = app.clone();
            async move { app.buy_retrying("DROP", 1).await.status }
        })
        .buffer_unordered(500)
        .collect()
        .await;
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let rejected = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!(
        (accepted, rejected),
        (100, 9_900),
        "every reply is 202 or 409"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 100);
    assert_eq!(
        app.buckets("DROP").await,
        Buckets {
            available: 0,
            reserved: 100,
            sold: 0
        }
    );
    assert_eq!(app.ledger("DROP").await, app.buckets("DROP").await);
}

/// The deadlocks PostgreSQL broke in the database `own` is connected to,
/// as far as its backends have reported them (each statement of its own
/// reads fresh statistics).
async fn deadlocks_reported(own: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(own)
        .await
        .expect("pg_stat_database")
}

/// Makes every backend report: a backend adds the deadlocks it lost to the
/// count when it next flushes its statistics, which an idle one may put off
/// for seconds, while one that exits flushes at once. So every backend on
/// the database but `own`'s (checkout's pool, the test's) is ended, and gone.
async fn flush_every_other_backend(own: &sqlx::PgPool) {
    let others =
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    sqlx::query(&format!("SELECT pg_terminate_backend(pid) {others}"))
        .execute(own)
        .await
        .expect("end the other backends");
    eventually(
        "the other backends to end",
        Duration::from_secs(30),
        || async {
            let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) {others}"))
                .fetch_one(own)
                .await
                .ok()?;
            (left == 0).then_some(())
        },
    )
    .await;
}

/// Checkout runs a placement PostgreSQL aborted to break a deadlock again,
/// and the buyers here retry a 503: neither would let a deadlock show in
/// the answers. PostgreSQL's own count of the deadlocks it broke does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_multi_line_orders_in_opposite_line_orders_never_deadlock() {
    let app = Arc::new(TestApp::spawn().await);
    let own = soldonce_tests::one_connection_pool(&app.database_url).await;
    let deadlocks_before = deadlocks_reported(&own).await;
    for sku in ["A", "B", "C"] {
        app.add_product(sku, 100, 150).await;
    }
    let shapes: [&[&str]; 4] = [&["A", "B", "C"], &["C", "B", "A"], &["B", "A"], &["C", "A"]];
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let app = app.clone();
            let skus = shapes[i % shapes.len()];
            let lines: Vec<_> = skus
                .iter()
                .map(|s| serde_json::json!({ "sku": s, "quantity": 1 }))
                .collect();
            tokio::spawn(async move {
                let body = serde_json::json!({ "lines": lines });
                app.place_retrying(&app.token, &uuid::Uuid::new_v4().to_string(), &body)
                    .await
                    .status
            })
        })
        .collect();
    for t in tasks {
        let status = t.await.expect("task");
        assert!(status == 202 || status == 409, "a client saw {status}");
    }
    for sku in ["A", "B", "C"] {
        let held = app
            .count(&format!(
                "SELECT coalesce(sum(l.quantity), 0)::bigint FROM order_lines l JOIN orders o ON o.id = l.order_id WHERE l.sku = '{sku}'"
            ))
            .await;
        let b = app.buckets(sku).await;
        assert_eq!(
            b.reserved, held,
            "{sku}: reserved equals the units on accepted orders"
        );
        assert_eq!(
            b.available + b.reserved,
            150,
            "{sku}: no unit created or lost"
        );
        assert_eq!(app.ledger(sku).await, b, "{sku}: ledger balances");
    }
    flush_every_other_backend(&own).await;
    assert_eq!(
        deadlocks_reported(&own).await,
        deadlocks_before,
        "deadlocks PostgreSQL broke during the run"
    );
}

#[tokio::test]
async fn units_another_writer_takes_between_the_unlocked_read_and_the_write_are_not_sold_again() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("MUG", 2500, 1).await;
    // Another writer holds the stock row, so the buyer reads 1 available
    // (no lock) and then waits at the write statement's stock move.
    let (mut other, other_pid) = app.hold_stock_row("MUG").await;
    let buyer = {
        let app = app.clone();
        tokio::spawn(async move {
            let body = serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] });
            app.place(&app.token, "the-last-mug", &body).await
        })
    };
    app.wait_blocked_by(other_pid, "the buyer to wait on the stock row")
        .await;
    // Meanwhile the other writer sells the last unit, and commits.
    sqlx::query(
        "WITH s AS (UPDATE stock SET available = available - 1, held = held + 1 WHERE sku = 'MUG') \
         UPDATE stock_sold SET sold = sold + 1 WHERE sku = 'MUG'",
    )
        .execute(&mut *other)
        .await
        .expect("take the unit");
    other.commit().await.expect("commit");

    // The buyer's move finds the unit gone: its whole write is rolled back
    // and the order refused, once the stock is read again under its lock.
    let reply = buyer.await.expect("buyer task");
    reply.assert_problem(409);
    assert_eq!(reply.body["sku"], "MUG", "the 409 names the SKU");
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 0,
            reserved: 0,
            sold: 1
        }
    );
    for (what, sql) in [
        ("orders", "SELECT count(*) FROM orders"),
        ("events", "SELECT count(*) FROM events"),
        ("outbox rows", "SELECT count(*) FROM outbox"),
        (
            "reservations in the ledger",
            "SELECT count(*) FROM stock_ledger WHERE movement = 'reserve'",
        ),
    ] {
        assert_eq!(app.count(sql).await, 0, "{what} of the refused order");
    }
    // The refusal is what the key now holds.
    let again = app
        .place(
            &app.token,
            "the-last-mug",
            &serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] }),
        )
        .await;
    assert_eq!((again.status, &again.body), (409, &reply.body));
}
