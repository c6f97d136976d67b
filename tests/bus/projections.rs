//! Every projection is the fold of the event store, and can be rebuilt from it.

use soldonce_tests::relay::binary;
use soldonce_tests::TestApp;

#[tokio::test]
async fn rebuilding_the_projection_from_events_yields_identical_rows_and_repairs_drift() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 100).await;
    let mut ids = vec![];
    for i in 0..10 {
        let placed = app.buy("MUG", 1 + i % 3).await;
        ids.push(placed.body["id"].as_str().expect("id").to_owned());
    }
    for id in ids.iter().step_by(3) {
        assert_eq!(
            app.post_empty(&app.token, &format!("/v1/orders/{id}/cancel"))
                .await
                .status,
            200
        );
    }
    let mut conn = app.pool.acquire().await.expect("conn");
    let before = store::projections::snapshot(&mut conn)
        .await
        .expect("snapshot");
    let report = store::projections::rebuild(&app.pool)
        .await
        .expect("rebuild");
    assert_eq!(
        (
            report.orders.rows,
            report.orders.corrected,
            report.orders.orphans_removed
        ),
        (10, 0, 0)
    );
    assert_eq!(
        store::projections::snapshot(&mut conn)
            .await
            .expect("snapshot"),
        before,
        "identical rows"
    );

    sqlx::query("UPDATE orders SET state = 'expired', version = 7 WHERE id = $1::uuid")
        .bind(&ids[1])
        .execute(&app.pool)
        .await
        .expect("tamper");
    let report = store::projections::rebuild(&app.pool)
        .await
        .expect("rebuild");
    assert_eq!(report.orders.corrected, 1, "the drifted row is found");
    assert_eq!(
        store::projections::snapshot(&mut conn)
            .await
            .expect("snapshot"),
        before,
        "and repaired"
    );
}

#[tokio::test]
async fn the_projections_rebuild_with_shipments_present_and_reports_drift_per_table() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let shipments: Vec<uuid::Uuid> = soldonce_tests::saga::shipped_orders(&app, "MUG", 2500, 3)
        .await
        .into_iter()
        .map(|(_, shipment)| shipment)
        .collect();
    store::shipments::advance_due(&app.pool, std::time::Duration::ZERO, 10, "test")
        .await
        .expect("advance");
    let mut conn = app.pool.acquire().await.expect("conn");
    let shipments_before = store::projections::snapshot_shipments(&mut conn)
        .await
        .expect("snapshot");
    sqlx::query("UPDATE shipments SET state = 'delivered', version = 9 WHERE id = $1")
        .bind(shipments[0])
        .execute(&app.pool)
        .await
        .expect("tamper");
    let rebuild = std::process::Command::new(binary("soldonce"))
        .args(["--json", "projections", "rebuild"])
        .env("DATABASE_URL", &app.database_url)
        .output()
        .expect("run soldonce projections rebuild");
    let text = String::from_utf8_lossy(&rebuild.stdout);
    assert_eq!(
        rebuild.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&rebuild.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("json report");
    assert_eq!(
        report["orders"],
        serde_json::json!({ "rows": 3, "corrected": 0, "orphans_removed": 0 })
    );
    assert_eq!(
        report["shipments"],
        serde_json::json!({ "rows": 3, "corrected": 1, "orphans_removed": 0 })
    );
    assert_eq!(
        store::projections::snapshot_shipments(&mut conn)
            .await
            .expect("snapshot"),
        shipments_before,
        "the drifted shipment is repaired"
    );
}

/// The rebuild works in short transactions beside live traffic: placing
/// orders never waits for it (it took an exclusive lock on `orders` for
/// the whole run before, minutes at a million orders). Placed one at a
/// time while it runs, each order is answered while the rebuild is still
/// running, and the rebuild still repairs every kind of drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_keeps_placing_orders_while_the_projections_rebuild() {
    use futures::{stream, StreamExt};
    let app = TestApp::spawn().await;
    app.add_product("MUG", 100, 100_000).await;
    let ids: Vec<uuid::Uuid> = stream::iter(0..1000)
        .map(|_| app.buy("MUG", 1))
        .buffer_unordered(32)
        .map(|placed| {
            assert_eq!(placed.status, 202, "{}", placed.body);
            placed.body["id"]
                .as_str()
                .expect("id")
                .parse::<uuid::Uuid>()
                .expect("uuid")
        })
        .collect()
        .await;
    let mut conn = app.pool.acquire().await.expect("conn");
    let before = store::projections::snapshot(&mut conn)
        .await
        .expect("snapshot");
    // Drift of every kind: wrong rows, a row missing, a row without events.
    let orphan = uuid::Uuid::now_v7();
    for sql in [
        "UPDATE orders SET state = 'expired', version = 9 WHERE id = $1 OR id = $2",
        "DELETE FROM order_lines WHERE order_id = $3",
        "DELETE FROM orders WHERE id = $3",
        "INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at) \
         SELECT $4, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at FROM orders WHERE id = $1",
        "INSERT INTO order_lines SELECT $4, sku, quantity, unit_price_minor FROM order_lines WHERE order_id = $1",
    ] {
        sqlx::query(sql)
            .bind(ids[10])
            .bind(ids[500])
            .bind(ids[900])
            .bind(orphan)
            .execute(&app.pool)
            .await
            .expect("tamper");
    }

    // Bad input: one line, exit 2, nothing rebuilt (the drift is still there below).
    let (code, said) = soldonce_tests::relay::soldonce(
        &["projections", "rebuild", "--batch-size", "0"],
        &[("DATABASE_URL", app.database_url.as_str())],
    );
    assert_eq!((code, said.trim().lines().count()), (Some(2), 1), "{said}");

    let mut rebuild = tokio::process::Command::new(binary("soldonce"))
        .args(["--json", "projections", "rebuild", "--batch-size", "5"])
        .env("DATABASE_URL", &app.database_url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run soldonce projections rebuild");
    let (mut answered_while_running, mut placed) = (0, vec![]);
    while rebuild.try_wait().expect("the rebuild").is_none() {
        let reply = app.buy("MUG", 1).await;
        assert_eq!(reply.status, 202, "{}", reply.body);
        placed.push(reply.body["id"].as_str().expect("id").to_owned());
        if rebuild.try_wait().expect("the rebuild").is_none() {
            answered_while_running += 1;
        }
    }
    let output = rebuild
        .wait_with_output()
        .await
        .expect("the rebuild's output");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        answered_while_running >= 10,
        "placed one at a time during the rebuild, {answered_while_running} of {} answered before it ended",
        placed.len()
    );
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("json report");
    assert_eq!(report["orders"]["corrected"], 3, "{report}");
    assert_eq!(report["orders"]["orphans_removed"], 1, "{report}");
    assert!(
        report["orders"]["rows"].as_u64() >= Some(1000) && report["batches"].as_u64() >= Some(200),
        "{report}"
    );

    // Matches the events: the rows as they were before the drift, and every order placed meanwhile.
    let after = store::projections::snapshot(&mut conn)
        .await
        .expect("snapshot");
    for (id, row) in &before {
        assert_eq!(after.get(id), Some(row), "order {id}");
    }
    assert!(!after.contains_key(&orphan));
    assert_eq!(after.len(), before.len() + placed.len());
    soldonce_tests::saga::assert_audit_clean(&app).await;
    let again = store::projections::rebuild(&app.pool)
        .await
        .expect("rebuild");
    assert_eq!(
        (again.orders.corrected, again.orders.orphans_removed),
        (0, 0)
    );
}
