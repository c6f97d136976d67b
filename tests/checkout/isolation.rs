//! A placement that fails in the database fails alone: the rest of its
//! coalesced group still commits together, in one transaction. Which
//! placements shared a transaction is read from PostgreSQL (`xmin`).

use futures::stream::{self, StreamExt};
use soldonce_tests::app::{Buckets, Reply};
use soldonce_tests::{metric_sample, TestApp};
use std::sync::Arc;
use uuid::Uuid;

/// What a buyer sends: a clean order, one with a NUL in its name (refused
/// by the parser), or one the database refuses (a constraint the test adds).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Clean,
    Nul,
    Poison,
}

fn body(sku: &str, kind: Kind) -> serde_json::Value {
    let name = match kind {
        Kind::Clean => "Ana Silva",
        Kind::Nul => "Ana\u{0}Silva",
        Kind::Poison => "POISON",
    };
    serde_json::json!({
        "lines": [{ "sku": sku, "quantity": 1 }],
        "shipping": { "name": name, "line1": "1 Main St", "city": "Porto Alegre", "postal_code": "90000", "country": "BR" }
    })
}

/// 300 buyers of `sku` at once, `kind(i)` each: every reply with its key.
async fn stampede(
    app: &Arc<TestApp>,
    sku: &str,
    kind: fn(usize) -> Kind,
) -> Vec<(Kind, String, Reply)> {
    stream::iter(0..300)
        .map(|i| {
            let (app, sku) = (app.clone(), sku.to_owned());
            async move {
                let key = Uuid::new_v4().to_string();
                let reply = app
                    .place_retrying(&app.token, &key, &body(&sku, kind(i)))
                    .await;
                (kind(i), key, reply)
            }
        })
        .buffer_unordered(300)
        .collect()
        .await
}

/// Orders of `sku` and the transactions that inserted them.
async fn orders_and_transactions(app: &TestApp, sku: &str) -> (i64, i64) {
    let (orders, transactions): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT o.xmin::text) FROM orders o JOIN order_lines l ON l.order_id = o.id WHERE l.sku = $1",
    )
    .bind(sku)
    .fetch_one(&app.pool)
    .await
    .expect("orders of the sku");
    (orders, transactions)
}

/// One buyer in twenty sends a NUL (a 422 from the parser, nothing
/// written) and one in twenty an order the database refuses: each of those
/// fails alone, every other buyer gets 202, and the good orders stay
/// grouped about as densely as in a clean stampede on the same checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_or_a_refused_row_fails_alone_and_the_hot_sku_stays_grouped() {
    let app = Arc::new(TestApp::spawn().await);
    app.add_product("CLEAN", 1000, 1_000).await;
    app.add_product("HOT", 1000, 1_000).await;
    sqlx::query(
        "ALTER TABLE orders ADD CONSTRAINT test_no_poison CHECK (shipping->>'name' IS DISTINCT FROM 'POISON')",
    )
    .execute(&app.pool)
    .await
    .expect("add the poison constraint");

    let clean = stampede(&app, "CLEAN", |_| Kind::Clean).await;
    assert!(clean.iter().all(|(_, _, r)| r.status == 202));
    let (clean_orders, clean_transactions) = orders_and_transactions(&app, "CLEAN").await;
    assert_eq!(clean_orders, 300);

    // The registry is the whole test process's: this stampede's share is what it adds.
    let isolated_before = isolated_placements(&app).await;
    let replies = stampede(&app, "HOT", |i| match i % 20 {
        0 => Kind::Nul,
        10 => Kind::Poison,
        _ => Kind::Clean,
    })
    .await;
    let mut accepted = 0;
    for (kind, key, reply) in &replies {
        match kind {
            Kind::Clean => {
                assert_eq!(reply.status, 202, "{}", reply.body);
                accepted += 1;
            }
            Kind::Nul => {
                reply.assert_problem(422);
                assert_eq!(reply.body["field"], "shipping.name");
            }
            Kind::Poison => reply.assert_problem(500),
        }
        if *kind != Kind::Clean {
            let stored = app
                .count(&format!(
                    "SELECT count(*) FROM idempotency_keys WHERE key = '{key}'"
                ))
                .await;
            assert_eq!(stored, 0, "{kind:?}: a refused placement stores nothing");
        }
    }
    assert_eq!(accepted, 270);
    let (orders, transactions) = orders_and_transactions(&app, "HOT").await;
    assert_eq!(orders, accepted, "an order row per 202");
    assert_eq!(
        app.buckets("HOT").await,
        Buckets {
            available: 1_000 - accepted,
            reserved: accepted,
            sold: 0
        },
        "units reserved equal the 202s"
    );
    assert_eq!(app.ledger("HOT").await, app.buckets("HOT").await);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE shipping->>'name' <> 'Ana Silva'")
            .await,
        0,
        "only clean addresses were written"
    );
    // Grouping: the same order of magnitude of orders per transaction as
    // the clean stampede (one commit per order would be 1 per transaction).
    let clean_density = clean_orders as f64 / clean_transactions as f64;
    let density = orders as f64 / transactions as f64;
    assert!(
        density * 2.0 >= clean_density && density >= 2.0,
        "{orders} orders in {transactions} transactions ({density:.1} each), clean: {clean_orders} in {clean_transactions} ({clean_density:.1})"
    );
    let isolated = isolated_placements(&app).await - isolated_before;
    assert!(
        isolated >= 15.0,
        "the 15 refused placements counted: {isolated}"
    );
}

/// Placements that failed alone, counted by every checkout of this process.
async fn isolated_placements(app: &TestApp) -> f64 {
    metric_sample(
        &app.metrics().await,
        "soldonce_checkout_isolated_placements_total",
    )
    .unwrap_or(0.0)
}
