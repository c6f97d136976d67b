//! The orders projection is the fold of the event store, and can be rebuilt from it.

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
        assert_eq!(app.post_empty(&app.token, &format!("/v1/orders/{id}/cancel")).await.status, 200);
    }
    let mut conn = app.pool.acquire().await.expect("conn");
    let before = store::projections::snapshot(&mut conn).await.expect("snapshot");
    let report = store::projections::rebuild(&app.pool).await.expect("rebuild");
    assert_eq!((report.orders, report.corrected, report.orphans_removed), (10, 0, 0));
    assert_eq!(store::projections::snapshot(&mut conn).await.expect("snapshot"), before, "identical rows");

    sqlx::query("UPDATE orders SET state = 'confirmed', version = 7 WHERE id = $1::uuid")
        .bind(&ids[1])
        .execute(&app.pool)
        .await
        .expect("tamper");
    let report = store::projections::rebuild(&app.pool).await.expect("rebuild");
    assert_eq!(report.corrected, 1, "the drifted row is found");
    assert_eq!(store::projections::snapshot(&mut conn).await.expect("snapshot"), before, "and repaired");
}
