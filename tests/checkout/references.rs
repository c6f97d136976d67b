//! The rows an order writes name its account, its products and each other
//! without foreign keys (migration 40): a placement locks neither the
//! product's row nor the account's, deleting what orders name is refused as
//! the keys refused it, and the full audit names any row that names what is
//! not there.

use soldonce_tests::TestApp;
use std::time::Duration;
use uuid::Uuid;

/// Another writer holds the product's and the account's rows `FOR UPDATE`
/// (a lock a foreign-key check waits for): the placement goes through
/// anyway, and its order and line are in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_locks_neither_its_products_row_nor_its_accounts() {
    let app = TestApp::spawn().await;
    app.add_product("REF-LOCK", 1000, 10).await;
    let mut holder = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM products WHERE sku = 'REF-LOCK' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .expect("lock the product's row");
    sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE")
        .bind(app.account_id)
        .execute(&mut *holder)
        .await
        .expect("lock the account's row");
    let reply = tokio::time::timeout(Duration::from_secs(30), app.buy("REF-LOCK", 2))
        .await
        .expect("the placement waited on the product's or the account's row");
    assert_eq!(reply.status, 202, "{:?}", reply.body);
    let order_id = reply.body["id"].as_str().expect("order id").to_owned();
    let lines = app
        .count(&format!(
            "SELECT count(*) FROM order_lines l JOIN orders o ON o.id = l.order_id \
             WHERE o.id = '{order_id}' AND o.account_id = '{}' AND l.sku = 'REF-LOCK' AND l.quantity = 2",
            app.account_id
        ))
        .await;
    assert_eq!(
        lines, 1,
        "the order and its line, written while the rows were held"
    );
    holder.rollback().await.expect("release");
    assert_eq!(app.buckets("REF-LOCK").await.reserved, 2);
}

/// Deleting an account or a product that an order names fails with the
/// foreign-key violation's code and changes nothing; rows forged to name
/// what does not exist are each named by the full audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_orders_name_stays_and_the_audit_names_rows_that_name_nothing() {
    let app = TestApp::spawn().await;
    app.add_product("REF-KEPT", 1000, 10).await;
    let reply = app.buy("REF-KEPT", 1).await;
    assert_eq!(reply.status, 202, "{:?}", reply.body);
    let audit = || async {
        store::audit::run(&app.pool, &store::audit::AuditOptions::default())
            .await
            .expect("audit")
    };
    let dangling = |report: &store::audit::AuditReport| -> Vec<String> {
        report
            .violations
            .iter()
            .filter(|v| v.check == "dangling_reference")
            .map(|v| format!("{}: {}", v.subject, v.detail))
            .collect()
    };
    assert_eq!(dangling(&audit().await), Vec::<String>::new());

    for (statement, says) in [
        (
            "DELETE FROM products WHERE sku = 'REF-KEPT'",
            "deactivate it",
        ),
        (
            "DELETE FROM accounts WHERE id = (SELECT account_id FROM orders LIMIT 1)",
            "has orders",
        ),
    ] {
        let err = sqlx::query(statement)
            .execute(&app.pool)
            .await
            .expect_err(statement);
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("23503"), "{statement}: {db}");
        assert!(db.message().contains(says), "{statement}: {db}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM products WHERE sku = 'REF-KEPT'")
            .await,
        1
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM accounts WHERE id = '{}'",
            app.account_id
        ))
        .await,
        1
    );

    let (missing_order, missing_account) = (Uuid::now_v7(), Uuid::now_v7());
    let shipment = Uuid::now_v7();
    for forged in [
        format!("INSERT INTO order_lines (order_id, sku, quantity, unit_price_minor) VALUES ('{missing_order}', 'NO-SUCH-SKU', 1, 1)"),
        format!("UPDATE orders SET account_id = '{missing_account}'"),
        format!("INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) VALUES ('{shipment}', '{missing_order}', 'pending', 1, now(), now())"),
    ] {
        sqlx::query(&forged).execute(&app.pool).await.expect(&forged);
    }
    let mut found = dangling(&audit().await);
    found.sort();
    let mut expected = vec![
        format!("{missing_order} NO-SUCH-SKU: order_lines.order_id names order {missing_order}, which does not exist"),
        format!("{missing_order} NO-SUCH-SKU: order_lines.sku names product NO-SUCH-SKU, which does not exist"),
        format!("{}: orders.account_id names account {missing_account}, which does not exist", reply.body["id"].as_str().expect("order id")),
        format!("{shipment}: shipments.order_id names order {missing_order}, which does not exist"),
    ];
    expected.sort();
    assert_eq!(found, expected);
}
