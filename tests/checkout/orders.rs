//! Reading, listing the history of, and cancelling orders; auth and ownership.

use soldonce_tests::app::Buckets;
use soldonce_tests::TestApp;
use std::time::Duration;

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
        "one outbox row per writing statement: the placing and the cancel"
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

/// Every page of `GET /v1/orders` for `token`, `limit` at a time: each page's ids.
async fn pages(app: &TestApp, token: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/orders?limit={limit}&cursor={c}"),
            None => format!("/v1/orders?limit={limit}"),
        };
        let page = app.get(token, &path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let ids: Vec<String> = page.body["orders"]
            .as_array()
            .expect("orders")
            .iter()
            .map(|o| o["id"].as_str().expect("id").to_owned())
            .collect();
        assert!(ids.len() <= limit, "{}", page.body);
        pages.push(ids);
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return pages,
        }
    }
}

#[tokio::test]
async fn the_orders_list_pages_an_accounts_orders_newest_first_each_once() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 100).await;
    let mut placed = vec![];
    for _ in 0..7 {
        let r = app.buy("MUG", 1).await;
        assert_eq!(r.status, 202);
        placed.push(r.body["id"].as_str().expect("id").to_owned());
    }
    let (_, stranger) = app.new_account("stranger").await;
    let theirs = app
        .place(
            &stranger,
            "s-1",
            &serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] }),
        )
        .await;
    assert_eq!(theirs.status, 202);

    let listed: Vec<Vec<String>> = pages(&app, &app.token, 3).await;
    assert_eq!(
        listed.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 3, 1]
    );
    let all: Vec<String> = listed.concat();
    // Newest first, each once, only this account's: counted against the rows too.
    let newest_first: Vec<String> = sqlx::query_scalar::<_, uuid::Uuid>(
        "SELECT id FROM orders WHERE account_id = (SELECT account_id FROM orders WHERE id = $1) ORDER BY created_at DESC, id DESC",
    )
    .bind(placed[0].parse::<uuid::Uuid>().expect("uuid"))
    .fetch_all(&app.pool)
    .await
    .expect("rows")
    .into_iter()
    .map(|id| id.to_string())
    .collect();
    assert_eq!(all, newest_first);
    let mut sorted = all.clone();
    sorted.sort();
    let mut mine = placed.clone();
    mine.sort();
    assert_eq!(sorted, mine, "exactly this account's 7 orders");

    // An order placed between pages does not shift or repeat the later ones.
    let first = app.get(&app.token, "/v1/orders?limit=3").await;
    let cursor = first.body["next_cursor"]
        .as_str()
        .expect("a cursor")
        .to_owned();
    assert_eq!(app.buy("MUG", 1).await.status, 202);
    let second = app
        .get(&app.token, &format!("/v1/orders?limit=3&cursor={cursor}"))
        .await;
    let second: Vec<&str> = second.body["orders"]
        .as_array()
        .expect("orders")
        .iter()
        .map(|o| o["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        second,
        all[3..6].iter().map(String::as_str).collect::<Vec<_>>()
    );

    // Bad input: a clear 422, nothing else.
    for path in [
        "/v1/orders?limit=0",
        "/v1/orders?limit=201",
        "/v1/orders?limit=ten",
        "/v1/orders?cursor=not-a-cursor",
    ] {
        app.get(&app.token, path).await.assert_problem(422);
    }
    assert_eq!(pages(&app, &stranger, 50).await.concat().len(), 1);
}

#[tokio::test]
async fn an_orders_event_is_stored_as_the_json_text_it_was_written_with() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 1).await;
    let placed = app.buy("MUG", 1).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let id = placed.body["id"].as_str().expect("order id").to_owned();
    let (data, metadata): (String, serde_json::Value) = sqlx::query_as(
        "SELECT e.data::text, e.metadata FROM events e WHERE e.stream_id = $1::uuid AND e.version = 1",
    )
    .bind(&id)
    .fetch_one(&app.pool)
    .await
    .expect("the order's first event");
    // As serde wrote it (compact): jsonb would print it again, a space
    // after every colon and the keys in its own order.
    let value: serde_json::Value = serde_json::from_str(&data).expect("JSON");
    assert_eq!(
        data,
        serde_json::to_string(&value).expect("JSON"),
        "data as written"
    );
    // The metadata's columns, read back as the object they were (`e.metadata`).
    let meta: events::Metadata = serde_json::from_value(metadata).expect("metadata");
    assert_eq!(meta.correlation_id.to_string(), id, "the order's saga");
    assert_eq!(meta.source, "checkout");
    assert!(
        meta.traceparent
            .as_deref()
            .and_then(platform::trace::TraceParent::parse)
            .is_some(),
        "the request's trace: {meta:?}"
    );
    let data: serde_json::Value = serde_json::from_str(&data).expect("JSON");
    assert_eq!(data["order_id"].as_str(), Some(id.as_str()));
    assert_eq!(data["lines"][0]["sku"], "MUG");
}

/// A buyer polls the order placed a moment ago, lists their orders, or
/// cancels one (its row locked: operators' commands, refunds and disputes
/// lock an order through the same read). On
/// a new store `orders` is nearly empty when those reads are first planned,
/// and a statement kept prepared on a connection keeps the plan PostgreSQL
/// settles on after five calls: made on a table of one order, a scan,
/// which then reads the whole table at every look as a flash sale grows
/// it, until autovacuum analyzes it again. The reads run in `orders_by_id`
/// (twice for the cancel: the account checked unlocked, then the lock) and
/// `orders_of_account`, planned at each call with the values given: on
/// the grown table they read no row by scanning, where the same statement
/// prepared on its own reads them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyers_look_at_an_order_or_at_their_list_reads_by_key_however_the_table_grew_since_first_planned(
) {
    use store::orders::Transition;
    // `account`'s cancel of `order`, as checkout's `POST …/cancel` runs it.
    async fn cancel(pool: &sqlx::PgPool, order: uuid::Uuid, account: uuid::Uuid) -> Transition {
        let meta = events::Metadata::from_request("test", order, None);
        let at = store::now();
        store::orders::transition(pool, order, Some(account), &meta, |_| {
            domain::Command::Cancel { at }
        })
        .await
        .expect("a cancel")
    }
    const DIRECT: &str = "PREPARE direct(uuid, uuid) AS SELECT o.id FROM orders o \
                          WHERE o.id = $1 AND ($2::uuid IS NULL OR o.account_id = $2)";
    let app = TestApp::spawn().await;
    // The buyer's order first, and checkout's counts of it flushed: from
    // then on only this test's session touches `orders`.
    app.add_product("MUG", 2500, 10).await;
    let placed = app.buy("MUG", 2).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let id: uuid::Uuid = placed.body["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the order's id");
    const INSERTED: &str = "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'orders'";
    soldonce_tests::eventually(
        "checkout's counts to reach the statistics",
        Duration::from_secs(30),
        || async { (app.count(INSERTED).await >= 1).then_some(()) },
    )
    .await;
    let pool =
        soldonce_tests::pool_on_frozen_statistics(&app.database_url, &["orders"], &[DIRECT]).await;
    for _ in 0..7 {
        let none = store::orders::load(&pool, uuid::Uuid::now_v7(), None)
            .await
            .expect("a look on the one-order table");
        assert!(none.is_none());
        let (page, _) = store::orders::list_for_account(&pool, uuid::Uuid::now_v7(), None, 10)
            .await
            .expect("a list on the one-order table");
        assert!(page.is_empty());
        sqlx::query("EXECUTE direct(gen_random_uuid(), NULL)")
            .execute(&pool)
            .await
            .expect("the direct statement on the one-order table");
        let missing = cancel(&pool, uuid::Uuid::now_v7(), uuid::Uuid::now_v7()).await;
        assert_eq!(
            missing,
            Transition::NotFound,
            "a cancel on the one-order table"
        );
    }

    // The table grows by 20,000 orders of another account.
    soldonce_tests::run_all(
        &pool,
        &[
            "INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000aa', 'grown')",
            "INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at) \
             SELECT gen_random_uuid(), '00000000-0000-0000-0000-0000000000aa', 'payment_pending', 'BRL', 100, 1, now(), now(), now() \
             FROM generate_series(1, 20000)",
        ],
    )
    .await;

    // The store's read, on the statement its connection kept prepared.
    let before = soldonce_tests::rows_scanned(&pool, "orders").await;
    let found = store::orders::load(&pool, id, Some(app.account_id))
        .await
        .expect("the buyer's look")
        .expect("the buyer's order");
    let scanned = soldonce_tests::rows_scanned(&pool, "orders").await - before;
    assert_eq!((found.id, found.total_minor), (id, 5000));
    assert_eq!(scanned, 0, "the look on the grown table scans no order");
    let stranger = uuid::Uuid::now_v7();
    let hidden = store::orders::load(&pool, id, Some(stranger))
        .await
        .expect("another account's look");
    assert!(hidden.is_none(), "another account does not see the order");
    // The buyer's list: their one order among 20,001, read by the account's key.
    let before = soldonce_tests::rows_scanned(&pool, "orders").await;
    let (page, end) = store::orders::list_for_account(&pool, app.account_id, None, 10)
        .await
        .expect("the buyer's list");
    let scanned = soldonce_tests::rows_scanned(&pool, "orders").await - before;
    assert_eq!(page.iter().map(|o| o.id).collect::<Vec<_>>(), [id]);
    assert!(end.is_none(), "one page");
    assert_eq!(scanned, 0, "the list on the grown table scans no order");
    // A stranger's cancel finds nothing and locks nothing; the buyer's
    // cancel locks their order by its key.
    let mut stranger_tx = pool.begin().await.expect("the stranger's transaction");
    let meta = events::Metadata::from_request("test", id, None);
    let at = store::now();
    let stranger_cancel =
        store::orders::transition_in(&mut stranger_tx, id, Some(stranger), &meta, |_| {
            domain::Command::Cancel { at }
        })
        .await
        .expect("the stranger's cancel");
    assert_eq!(stranger_cancel, Transition::NotFound, "not the stranger's");
    // While the stranger's transaction is still open, the order is not locked.
    let mut other = app.pool.begin().await.expect("another transaction");
    let unlocked: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM orders WHERE id = $1 FOR UPDATE NOWAIT")
            .bind(id)
            .fetch_all(&mut *other)
            .await
            .expect("the order is not locked by the stranger's cancel");
    assert_eq!(unlocked, [id]);
    other.rollback().await.expect("rollback");
    stranger_tx.rollback().await.expect("rollback");
    let before = soldonce_tests::rows_scanned(&pool, "orders").await;
    let cancelled = cancel(&pool, id, app.account_id).await;
    let scanned = soldonce_tests::rows_scanned(&pool, "orders").await - before;
    match cancelled {
        Transition::Applied(order) => assert_eq!(order.state, domain::OrderState::Cancelled),
        other => panic!("the buyer's cancel: {other:?}"),
    }
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM orders WHERE id = '{id}' AND state = 'cancelled'"
        ))
        .await,
        1,
        "cancelled in the table"
    );
    assert_eq!(scanned, 0, "the cancel on the grown table scans no order");
    soldonce_tests::assert_kept_prepared(
        &pool,
        &[
            store::orders::ONE_SQL,
            store::orders::PAGE_SQL,
            store::orders::LOCKED_SQL,
        ],
    )
    .await;

    // The same statement prepared on its own kept the small table's plan.
    soldonce_tests::assert_kept_plan_scans(
        &pool,
        "orders",
        "EXECUTE direct(gen_random_uuid(), NULL)",
    )
    .await;
}
