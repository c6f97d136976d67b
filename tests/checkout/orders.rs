//! Reading, listing the history of, and cancelling orders; auth and ownership.

use soldonce_tests::app::Buckets;
use soldonce_tests::TestApp;

#[tokio::test]
async fn an_order_reads_back_in_the_shape_it_was_placed() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let placed = app.buy("MUG", 3).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let location = placed.header("location").expect("Location").to_owned();
    let read = app.get(&app.token, &location).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body, placed.body);
    assert_eq!(read.body["state"], "payment_pending");
    assert_eq!(read.body["lines"][0]["unit_price_minor"], 2500);
    assert_eq!(read.body["total_minor"], 7500);
    assert!(
        read.body["expires_at"].as_str().expect("expires_at")
            > read.body["created_at"].as_str().expect("created_at")
    );
}

#[tokio::test]
async fn the_events_endpoint_shows_the_history_and_it_folds_into_the_projection() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let placed = app.buy("MUG", 1).await;
    let id: uuid::Uuid = placed.body["id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    app.post_empty(&app.token, &format!("/v1/orders/{id}/cancel"))
        .await;
    let events = app
        .get(&app.token, &format!("/v1/orders/{id}/events"))
        .await;
    assert_eq!(events.status, 200);
    let types: Vec<_> = events.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(types, ["order.placed.v1", "order.cancelled.v1"]);
    let history = store::orders::history(&app.pool, id, None)
        .await
        .expect("history")
        .expect("exists");
    let folded = store::orders::fold_history(&history)
        .expect("fold")
        .expect("order");
    let projected = store::orders::load(&app.pool, id, None)
        .await
        .expect("load")
        .expect("order");
    assert_eq!(
        folded, projected,
        "the projection is the fold of the events"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox").await,
        2,
        "one outbox row per event"
    );
}

#[tokio::test]
async fn cancelling_a_pending_order_releases_its_units_once() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let placed = app.buy("MUG", 4).await;
    let path = format!(
        "/v1/orders/{}/cancel",
        placed.body["id"].as_str().expect("id")
    );
    let cancelled = app.post_empty(&app.token, &path).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["state"], "cancelled");
    let again = app.post_empty(&app.token, &path).await;
    again.assert_problem(409);
    assert_eq!(again.body["state"], "cancelled");
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 10,
            reserved: 0,
            sold: 0
        }
    );
    assert_eq!(app.ledger("MUG").await, app.buckets("MUG").await);
    assert_eq!(
        app.count("SELECT count(*) FROM stock_ledger WHERE movement = 'release'")
            .await,
        1
    );
}

#[tokio::test]
async fn requests_without_a_valid_token_are_401() {
    let app = TestApp::spawn().await;
    let none = app
        .send(
            app.client
                .get(app.url("/v1/orders/00000000-0000-0000-0000-000000000000")),
        )
        .await;
    none.assert_problem(401);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    app.get(
        "so_not_a_token",
        "/v1/orders/00000000-0000-0000-0000-000000000000",
    )
    .await
    .assert_problem(401);
    let basic = app
        .send(
            app.client
                .get(app.url("/v1/orders/x"))
                .header("authorization", "Basic YTpi"),
        )
        .await;
    basic.assert_problem(401);
}

#[tokio::test]
async fn another_accounts_order_is_404_for_read_history_and_cancel() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let placed = app.buy("MUG", 1).await;
    let id = placed.body["id"].as_str().expect("id").to_owned();
    let (_, stranger) = app.new_account("stranger").await;
    app.get(&stranger, &format!("/v1/orders/{id}"))
        .await
        .assert_problem(404);
    app.get(&stranger, &format!("/v1/orders/{id}/events"))
        .await
        .assert_problem(404);
    app.post_empty(&stranger, &format!("/v1/orders/{id}/cancel"))
        .await
        .assert_problem(404);
    app.get(&app.token, "/v1/orders/not-a-uuid")
        .await
        .assert_problem(404);
    assert_eq!(
        app.buckets("MUG").await.reserved,
        1,
        "the stranger's cancel changed nothing"
    );
}

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    app.buy("MUG", 1).await;
    assert_eq!(app.get("", "/healthz").await.status, 200);
    assert_eq!(app.get("", "/readyz").await.status, 200);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("soldonce_checkout_requests_total"),
        "{metrics}"
    );
}
