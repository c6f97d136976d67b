//! Every projection is the fold of the event store, and can be rebuilt from it.

use soldonce_tests::relay::binary;
use soldonce_tests::saga::pay_by_webhook;
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
    let mut shipments = vec![];
    for _ in 0..3 {
        let id = app.buy("MUG", 1).await.body["id"]
            .as_str()
            .expect("id")
            .to_owned();
        assert_eq!(pay_by_webhook(&app, &id, 2500).await, 200);
        let meta = events::Metadata {
            correlation_id: id.parse().expect("uuid"),
            causation_id: uuid::Uuid::now_v7(),
            source: "test".into(),
            traceparent: None,
        };
        let mut tx = app.pool.begin().await.expect("tx");
        shipments.push(
            match store::shipments::create_many(&mut tx, &[(id.parse().expect("uuid"), meta)])
                .await
                .expect("ship")[..]
            {
                [store::shipments::Created::New(s)] => s,
                ref other => panic!("expected a new shipment, got {other:?}"),
            },
        );
        tx.commit().await.expect("commit");
    }
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
