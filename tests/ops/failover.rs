//! PostgreSQL failover, step by step: a primary with a synchronous standby,
//! checkout and the relay given both in one `DATABASE_URL`. While the
//! standby is away a commit waits unseen; if that wait is cancelled the
//! primary keeps the commit, shows it and reports it done, and still
//! checkout must not answer 202 on it (nor replay one for its key) and the
//! relay must not publish its event until the standby has it. Once the primary is gone and
//! the standby promoted, both services follow it without a restart. (The chaos
//! suite's failover test runs the same under load with every other fault.)

use localservers::Nats;
use soldonce_tests::relay::{read_stream, spawn_in_process, stream_len};
use soldonce_tests::servers::{
    commit_waiting_for_standby, migrated_database_on, primary_with_standby,
};
use soldonce_tests::{eventually, TestApp};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// The order's events, each on the stream exactly once.
async fn published(app: &TestApp, nats_url: &str, order: Uuid) -> Option<usize> {
    let ids: Vec<(Uuid,)> = sqlx::query_as("SELECT event_id FROM events WHERE stream_id = $1")
        .bind(order)
        .fetch_all(&app.pool)
        .await
        .ok()?;
    let stream = read_stream(nats_url).await;
    let all = !ids.is_empty()
        && ids
            .iter()
            .all(|(id,)| stream.get(id).map(|c| c.0) == Some(1));
    all.then_some(ids.len())
}

fn order_id(reply: &soldonce_tests::app::Reply) -> Uuid {
    reply.body["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an order id in {}", reply.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_commit_is_never_published_and_both_services_follow_the_promoted_standby() {
    let dirs = tempfile::tempdir().expect("temp dir");
    let (mut primary, mut standby) = primary_with_standby(dirs.path());
    migrated_database_on(&primary).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let nats = Nats::start_temporary().expect("private nats");
    let nats_url = nats.url();
    let _relay = spawn_in_process(&url, &nats_url).await;
    let app = TestApp::spawn_on(url.clone(), Duration::from_secs(900)).await;
    // A second checkout whose lanes have a thread and connections of their own.
    let own = TestApp::spawn_configured(url.clone(), Duration::from_secs(900), |s| {
        s.coalesce.own_thread = true;
    })
    .await;
    app.add_product("FO-1", 1_000, 10).await;

    // Both servers up: an order's event is published as usual.
    let first = app.buy("FO-1", 1).await;
    assert_eq!(first.status, 202, "{}", first.body);
    eventually(
        "the first order on the stream",
        Duration::from_secs(30),
        || published(&app, &nats_url, order_id(&first)),
    )
    .await;
    let js = bus::connect(&nats_url).await.expect("nats");
    let before = stream_len(&js).await;

    // Counted by every relay of this test process: this one's refusal is what it adds.
    let unconfirmed = || async {
        soldonce_tests::metric_sample(
            &app.metrics().await,
            "soldonce_replication_unconfirmed_total{site=\"relay\"}",
        )
    };
    let unconfirmed_before = unconfirmed().await.unwrap_or(0.0);

    // The standby goes away: the next placement's commit waits for it, and
    // while it waits nobody sees it.
    standby.stop();
    let key = Uuid::new_v4().to_string();
    let body = serde_json::json!({"lines": [{"sku": "FO-1", "quantity": 1}]});
    let placing = {
        let app_url = app.url("/v1/orders");
        let token = app.token.clone();
        let client = app.client.clone();
        let (key, body) = (key.clone(), body.clone());
        tokio::spawn(async move {
            client
                .post(app_url)
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .expect("checkout answers")
        })
    };
    let watch = PgPool::connect(&primary.url("postgres"))
        .await
        .expect("a direct connection to the primary");
    // The placement's `COMMIT`. Other commits wait for the standby too, and
    // cancelling one of them instead would leave the placement waiting: the
    // relay's barrier and an autovacuum worker's ANALYZE of the new tables.
    // (The relay's hold on the wake-up, a `setval` sent right after its
    // drain of the first order, used to wait as well; it now commits without
    // waiting, see `bus::relay::holding_the_wake_up_never_waits_…`.)
    let pid =
        commit_waiting_for_standby(&watch, "the placement's commit waiting for the standby").await;
    let outbox = "SELECT count(*) FROM outbox";
    let (visible,): (i64,) = sqlx::query_as(outbox)
        .fetch_one(&watch)
        .await
        .expect("outbox");
    assert_eq!(
        visible, 0,
        "a commit waiting for the standby is seen by no one"
    );
    assert!(
        !placing.is_finished(),
        "no answer before the standby has the order"
    );

    // Cancelling that wait (an operator's pg_cancel_backend, a pooler's
    // timeout) makes PostgreSQL keep the commit locally, visible at once,
    // though the standby never got it, and report it as done: checkout must
    // not answer 202 on it, nor the relay publish it.
    sqlx::query("SELECT pg_cancel_backend($1)")
        .bind(pid)
        .execute(&watch)
        .await
        .expect("cancel the wait");
    let cancelled = tokio::time::timeout(Duration::from_secs(30), placing)
        .await
        .expect("the placement returns once its wait is cancelled")
        .expect("placing task");
    assert_eq!(
        cancelled.status(),
        503,
        "no 202 for an order only the primary has"
    );
    assert!(cancelled.headers().contains_key("retry-after"));
    let (outbox,): (i64,) = sqlx::query_as(outbox)
        .fetch_one(&watch)
        .await
        .expect("outbox");
    assert!(outbox > 0, "the primary kept the commit and shows it");
    // The buyer retries with the same key: the stored answer is not replayed either.
    let retried = app.place(&app.token, &key, &body).await;
    assert_eq!(retried.status, 503, "{}", retried.body);
    // The relay claimed the row and refused to publish it.
    eventually(
        "the relay to refuse publishing an unconfirmed commit",
        Duration::from_secs(30),
        || async { unconfirmed().await.filter(|n| *n > unconfirmed_before) },
    )
    .await;
    assert_eq!(
        stream_len(&js).await,
        before,
        "nothing is published that the standby does not have"
    );

    // The standby is back: the same key now gets its 202, the event goes out, once.
    standby.restart().expect("standby back");
    let replayed = eventually(
        "the same key answered 202 once the standby has the order",
        Duration::from_secs(30),
        || async {
            let r = app.place(&app.token, &key, &body).await;
            (r.status == 202).then_some(r)
        },
    )
    .await;
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    let (second,): (Uuid,) = sqlx::query_as("SELECT id FROM orders WHERE id <> $1")
        .bind(order_id(&first))
        .fetch_one(&watch)
        .await
        .expect("the second order");
    assert_eq!(
        order_id(&replayed),
        second,
        "the retry answers the order the primary kept"
    );
    eventually(
        "the second order on the stream",
        Duration::from_secs(30),
        || published(&app, &nats_url, second),
    )
    .await;
    watch.close().await;

    // The primary dies for good; the standby is promoted. Checkout (both,
    // whatever thread their lanes run on) and the relay, never restarted,
    // take orders and publish them on it.
    primary.crash();
    standby.promote().expect("promote the standby");
    let third = app.buy_retrying("FO-1", 1).await;
    assert_eq!(third.status, 202, "{}", third.body);
    let fourth = own.buy_retrying("FO-1", 1).await;
    assert_eq!(fourth.status, 202, "{}", fourth.body);
    eventually(
        "the third order on the stream",
        Duration::from_secs(60),
        || published(&app, &nats_url, order_id(&third)),
    )
    .await;
    let (in_recovery,): (bool,) = sqlx::query_as("SELECT pg_is_in_recovery()")
        .fetch_one(
            &PgPool::connect(&standby.url("postgres"))
                .await
                .expect("new primary"),
        )
        .await
        .expect("ask the new primary");
    assert!(!in_recovery, "the standby was promoted");
    let orders: Vec<(Uuid,)> = sqlx::query_as("SELECT id FROM orders ORDER BY created_at")
        .fetch_all(&app.pool)
        .await
        .expect("orders on the new primary");
    assert_eq!(
        orders,
        vec![
            (order_id(&first),),
            (second,),
            (order_id(&third),),
            (order_id(&fourth),)
        ],
        "every order answered 202 is on the new primary, once"
    );
}
