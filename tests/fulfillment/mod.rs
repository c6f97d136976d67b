//! From paid to shipped, and back through history: fulfillment and replay.

use async_nats::jetstream::message::PublishMessage;
use futures::stream::{self, StreamExt};
use soldonce_tests::relay::binary;
use soldonce_tests::saga::Saga;
use std::time::Duration;

fn run_cli(saga: &Saga, args: &[&str]) -> (i32, String) {
    let (code, text) = soldonce_tests::relay::soldonce(
        args,
        &[
            ("DATABASE_URL", &saga.app.database_url),
            ("NATS_URL", &saga.nats.url()),
        ],
    );
    (code.unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_order_is_delivered_with_one_shipment_and_no_other_order_ships() {
    let mut saga = Saga::start(r#"{"decline_rate": 0.2}"#, Duration::from_secs(2)).await;
    saga.start_fulfillment(Duration::from_millis(20)).await;
    saga.app.add_product("MUG", 100, 1_000).await;
    let _: Vec<String> = stream::iter(0..500)
        .map(|_| saga.order("MUG"))
        .buffer_unordered(50)
        .collect()
        .await;
    saga.wait_quiescent(Duration::from_secs(90)).await;
    let app = &saga.app;
    let confirmed = app
        .count("SELECT count(*) FROM orders WHERE state = 'confirmed'")
        .await;
    assert!(
        confirmed > 300 && confirmed < 500,
        "about 80% paid: {confirmed}"
    );
    let failed = app
        .count("SELECT count(*) FROM orders WHERE state = 'payment_failed'")
        .await;
    assert_eq!(
        (confirmed + failed, saga.faults_injected("decline").await),
        (500, failed as f64),
        "every order paid or declined, each decline the PSP's"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM shipments").await,
        confirmed,
        "one shipment per confirmed order"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM shipments WHERE state = 'delivered'")
            .await,
        confirmed
    );
    let misshipped = app.count("SELECT count(*) FROM shipments s JOIN orders o ON o.id = s.order_id WHERE o.state <> 'confirmed'").await;
    assert_eq!(misshipped, 0, "no declined or expired order has a shipment");
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'shipment.delivered.v1'")
            .await,
        confirmed
    );

    // A redelivered order.confirmed (same event, new message id) still makes one shipment.
    let js = bus::connect(&saga.nats.url()).await.expect("nats");
    let (id, payload): (String, serde_json::Value) = sqlx::query_as(
        "SELECT e.stream_id::text, jsonb_build_object('specversion', '1.0', 'id', e.event_id, 'source', 'soldonce/payment-worker', \
           'type', 'soldonce.' || e.type, 'subject', e.stream_id::text, 'time', e.recorded_at, 'datacontenttype', 'application/json', \
           'correlationid', e.stream_id, 'causationid', e.event_id, 'data', e.data) \
         FROM events e WHERE e.type = 'order.confirmed.v1' LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a confirmed event");
    let msg = PublishMessage::build()
        .payload(serde_json::to_vec(&payload).expect("json").into())
        .message_id("redelivery");
    js.send_publish(format!("soldonce.order.confirmed.{id}"), msg)
        .await
        .expect("publish")
        .await
        .expect("ack");
    soldonce_tests::eventually(
        "fulfillment to take the redelivery",
        Duration::from_secs(30),
        || {
            let js = js.clone();
            async move {
                let mut c: async_nats::jetstream::consumer::PullConsumer = js
                    .get_consumer_from_stream("fulfillment", bus::STREAM)
                    .await
                    .ok()?;
                let info = c.info().await.ok()?;
                (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM shipments WHERE order_id = '{id}'"
        ))
        .await,
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM shipments").await, confirmed);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM events WHERE type = 'shipment.created.v1' AND data->>'order_id' = '{id}'"
        ))
        .await,
        1,
        "the redelivery recorded no second shipment event"
    );
    // Its shipment is the key that dedupes: fulfillment keeps no inbox rows.
    assert_eq!(
        app.count("SELECT count(*) FROM inbox WHERE consumer = 'fulfillment'")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_stream_reproduces_the_live_projections_and_names_bad_events() {
    // First a PSP that answers at once (a fifth declined, before the 600 ms
    // reservation ends), then one that answers after 700 ms (past it: the
    // orders expire, and their late payments are reclaimed or refunded).
    // Both kinds of ending are in the stream, whatever the machine's speed.
    let mut saga = Saga::start_with_ttl(
        r#"{"decline_rate": 0.2}"#,
        Duration::from_secs(5),
        Duration::from_millis(600),
    )
    .await;
    saga.start_fulfillment(Duration::from_millis(10)).await;
    saga.start_expiry(Duration::from_millis(50)).await;
    saga.app.add_product("MUG", 100, 2_500).await;
    for faults in [
        r#"{"decline_rate": 0.2}"#,
        r#"{"decline_rate": 0.2, "latency_ms": 700}"#,
    ] {
        saga.set_faults(faults).await;
        let _: Vec<String> = stream::iter(0..1_000)
            .map(|_| saga.order("MUG"))
            .buffer_unordered(100)
            .collect()
            .await;
    }
    saga.wait_quiescent(Duration::from_secs(120)).await;
    let app = &saga.app;
    let expired = app
        .count("SELECT count(*) FROM events WHERE type = 'order.expired.v1'")
        .await;
    let failed = app
        .count("SELECT count(*) FROM orders WHERE state = 'payment_failed'")
        .await;
    assert!(
        expired > 0 && failed > 0,
        "the run had expirations ({expired}) and declines ({failed})"
    );
    // A declined payment of an expired order leaves it expired.
    let declined = saga.faults_injected("decline").await;
    assert!(
        declined >= failed as f64,
        "{declined} declines at the PSP for {failed} failed orders"
    );

    let (code, text) = run_cli(&saga, &["replay"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("reproduces the live projections exactly"),
        "{text}"
    );

    // Tamper: garbage and an unknown version land in (this copy of) the stream.
    let js = bus::connect(&saga.nats.url()).await.expect("nats");
    for (msg_id, body) in [
        ("bad-1", b"{ tampered".to_vec()),
        (
            "bad-2",
            br#"{"specversion":"1.0","type":"soldonce.order.placed.v7"}"#.to_vec(),
        ),
    ] {
        let msg = PublishMessage::build()
            .payload(body.into())
            .message_id(msg_id);
        js.send_publish("soldonce.order.placed.tampered", msg)
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    let last = {
        let mut stream = js.get_stream(bus::STREAM).await.expect("stream");
        stream.info().await.expect("info").state.last_sequence
    };
    let (code, text) = run_cli(&saga, &["replay"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("stream sequence {}: not JSON", last - 1)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "stream sequence {last}: unknown event type or version soldonce.order.placed.v7"
        )),
        "{text}"
    );
}

/// `replay` can fail: live projection rows changed behind the stream's
/// back (an order's state, a shipment's) are each named with what the live
/// row and the stream say, nothing else is, and the run exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_exits_1_naming_each_projection_row_the_stream_contradicts() {
    let mut saga = Saga::start("{}", Duration::from_secs(2)).await;
    saga.start_fulfillment(Duration::from_millis(10)).await;
    saga.app.add_product("MUG", 100, 10).await;
    let mut ids = vec![];
    for _ in 0..3 {
        ids.push(saga.order("MUG").await.parse::<uuid::Uuid>().expect("uuid"));
    }
    saga.wait_quiescent(Duration::from_secs(60)).await;
    let (code, text) = run_cli(&saga, &["replay"]);
    assert_eq!(code, 0, "clean before the tampering: {text}");

    // Behind the stream's back: one order marked refunded, another's shipment
    // cancelled (states no running service moves on from).
    let app = &saga.app;
    let (state, version): (String, i32) =
        sqlx::query_as("SELECT state, version FROM orders WHERE id = $1")
            .bind(ids[0])
            .fetch_one(&app.pool)
            .await
            .expect("the order");
    assert_eq!(state, "confirmed", "the order was confirmed before");
    let (shipment, was): (uuid::Uuid, String) =
        sqlx::query_as("SELECT id, state FROM shipments WHERE order_id = $1")
            .bind(ids[1])
            .fetch_one(&app.pool)
            .await
            .expect("the shipment");
    assert_eq!(was, "delivered", "the shipment was delivered before");
    for (sql, id) in [
        ("UPDATE orders SET state = 'refunded' WHERE id = $1", ids[0]),
        (
            "UPDATE shipments SET state = 'cancelled' WHERE id = $1",
            shipment,
        ),
    ] {
        let done = sqlx::query(sql).bind(id).execute(&app.pool).await;
        assert_eq!(done.expect(sql).rows_affected(), 1, "{sql}");
    }

    let (code, text) = run_cli(&saga, &["replay"]);
    assert_eq!(code, 1, "{text}");
    let mut named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("DIFFERENCE "))
        .collect();
    named.sort_unstable();
    let mut expected = vec![
        format!(
            "order {}: live refunded v{version} / stream confirmed v{version}",
            ids[0]
        ),
        format!("shipment {shipment}: live cancelled / stream delivered"),
    ];
    expected.sort_unstable();
    assert_eq!(named, expected, "each tampered row, and only those: {text}");
    assert!(
        !text.contains("reproduces the live projections exactly"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_an_orders_timeline_and_follow_live_events() {
    let mut saga = Saga::start("{}", Duration::from_secs(2)).await;
    saga.start_fulfillment(Duration::from_millis(10)).await;
    saga.app.add_product("MUG", 100, 10).await;
    let mut tail = tokio::process::Command::new(binary("soldonce"))
        .args([
            "--json",
            "events",
            "tail",
            "--from-start",
            "--type",
            "shipment.delivered",
        ])
        .env("NATS_URL", saga.nats.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("events tail");
    let id = saga.order("MUG").await;
    saga.wait_quiescent(Duration::from_secs(30)).await;

    let (code, text) = run_cli(&saga, &["order", "show", &id]);
    assert_eq!(code, 0, "{text}");
    for expected in [
        "confirmed",
        "order.placed.v1",
        "order.confirmed.v1",
        "payment: pay_",
        "delivered",
        "payment-worker took order.placed.v1",
        "recorded order.confirmed.v1",
        "fulfillment took order.confirmed.v1",
        "recorded shipment.delivered.v1",
    ] {
        assert!(
            text.contains(expected),
            "order show lacks {expected:?}:\n{text}"
        );
    }
    let trace = text
        .lines()
        .find_map(|l| l.strip_prefix("trace id: "))
        .expect("a trace id line");
    assert!(
        trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit()),
        "the placement's W3C trace id: {trace:?}"
    );
    let (code, text) = run_cli(&saga, &["order", "show", "not-an-id"]);
    assert_eq!((code, text.trim().lines().count()), (2, 1), "{text}");

    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a line in time")
        .expect("read")
        .expect("a line");
    let event: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(
        event["type"], "soldonce.shipment.delivered.v1",
        "only the type asked for"
    );
    assert_eq!(event["data"]["order_id"], id.as_str());
}

/// One batch holding a confirmed order twice, an unpaid order and an order
/// that does not exist: one answer each, in the order given, from the
/// database's states; a second batch finds the shipment made; the
/// `shipments` rows and the event store count one shipment.
#[tokio::test]
async fn one_batch_ships_the_confirmed_order_once_and_answers_every_other_order_from_the_database()
{
    use domain::OrderState;
    use store::shipments::Created;
    let app = soldonce_tests::TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let id = |body: &serde_json::Value| -> uuid::Uuid {
        body["id"].as_str().expect("id").parse().expect("uuid")
    };
    let paid = id(&app.buy("MUG", 1).await.body);
    assert_eq!(
        soldonce_tests::saga::pay_by_webhook(&app, &paid.to_string(), 2500).await,
        200
    );
    let unpaid = id(&app.buy("MUG", 1).await.body);
    let missing = uuid::Uuid::now_v7();
    let meta = |order: uuid::Uuid| events::Metadata {
        correlation_id: order,
        causation_id: uuid::Uuid::now_v7(),
        source: "test".into(),
        traceparent: None,
        tracestate: None,
    };
    let batch = [paid, unpaid, paid, missing].map(|o| (o, meta(o)));
    let mut tx = app.pool.begin().await.expect("tx");
    let answers = store::shipments::create_many(&mut tx, &batch)
        .await
        .expect("ship");
    tx.commit().await.expect("commit");
    let [Created::New(shipment), rest @ ..] = &answers[..] else {
        panic!("the confirmed order gets a new shipment first, got {answers:?}");
    };
    assert_eq!(
        rest,
        [
            Created::NotConfirmed(Some(OrderState::PaymentPending)),
            Created::Existed,
            Created::NotConfirmed(None),
        ]
    );
    let mut tx = app.pool.begin().await.expect("tx");
    let again = store::shipments::create_many(&mut tx, &[(paid, meta(paid))])
        .await
        .expect("ship again");
    tx.commit().await.expect("commit");
    assert_eq!(again, [Created::Existed], "a redelivery ships nothing");
    let rows: Vec<(uuid::Uuid, uuid::Uuid)> = sqlx::query_as("SELECT id, order_id FROM shipments")
        .fetch_all(&app.pool)
        .await
        .expect("shipments");
    assert_eq!(
        rows,
        [(*shipment, paid)],
        "one shipments row, for the paid order"
    );
    let created: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT stream_id FROM events WHERE type = 'shipment.created.v1'")
            .fetch_all(&app.pool)
            .await
            .expect("events");
    assert_eq!(
        created,
        [*shipment],
        "one shipment created in the event store"
    );
}

/// The warehouse's look says when to look again: when the first open
/// shipment it did not take falls due (a step after its last one), nothing
/// when none is open or the only one is held by a dispute, and at once
/// when more were due than one look takes.
#[tokio::test]
async fn the_warehouse_look_says_when_the_next_shipment_falls_due() {
    use store::shipments::advance_due;
    let app = soldonce_tests::TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let step = Duration::from_secs(60);
    let look = |limit: i64| {
        let pool = app.pool.clone();
        async move { advance_due(&pool, step, limit, "test").await.expect("look") }
    };
    // Runs `sql` on the orders `$1` (an array).
    let on = |sql: &'static str, orders: Vec<uuid::Uuid>| {
        let pool = app.pool.clone();
        async move {
            sqlx::query(sql)
                .bind(&orders)
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    };
    assert_eq!(look(10).await.next_due, None, "nothing open");

    let orders: Vec<uuid::Uuid> = soldonce_tests::saga::shipped_orders(&app, "MUG", 2500, 3)
        .await
        .into_iter()
        .map(|(order, _)| order)
        .collect();
    let fresh = look(10).await;
    assert_eq!(fresh.steps, 0, "none is a step old");
    let next = fresh.next_due.expect("three open shipments");
    assert!(
        next > Duration::from_secs(50) && next <= step,
        "the first falls due a step after it was created: {next:?}"
    );

    // Two of them a step and more old: one look of one takes the oldest, and says more are due.
    const BACKDATE: &str =
        "UPDATE shipments SET updated_at = updated_at - interval '2 minutes' WHERE order_id = ANY($1)";
    const DELIVER: &str = "UPDATE shipments SET state = 'delivered' WHERE order_id = ANY($1)";
    on(BACKDATE, orders[..2].to_vec()).await;
    let one = look(1).await;
    assert_eq!((one.steps, one.next_due), (1, Some(Duration::ZERO)));
    let rest = look(10).await;
    assert_eq!(rest.steps, 1, "the other due one");
    assert!(
        rest.next_due.is_some_and(|d| d > Duration::from_secs(50)),
        "the next is a step away again: {:?}",
        rest.next_due
    );
    assert_eq!(
        app.count("SELECT count(*) FROM shipments WHERE state = 'picked'")
            .await,
        2,
        "the two due ones moved one step, counted in the table"
    );

    // With only the one it moves open, the look says when that one falls due again.
    on(DELIVER, orders[1..].to_vec()).await;
    on(BACKDATE, orders[..1].to_vec()).await;
    let moved = look(10).await;
    assert_eq!(
        (moved.steps, moved.next_due),
        (1, Some(step)),
        "what moved now falls due a step from now"
    );
    // The third open again.
    on(
        "UPDATE shipments SET state = 'pending' WHERE order_id = ANY($1)",
        orders[2..].to_vec(),
    )
    .await;

    // Held by a dispute, a shipment is never due: with the others delivered, nothing is open.
    on(
        "INSERT INTO shipment_holds (order_id, dispute_id) SELECT o, 'dp_test' FROM unnest($1::uuid[]) AS o",
        orders[2..].to_vec(),
    )
    .await;
    on(DELIVER, orders[..2].to_vec()).await;
    assert_eq!(look(10).await.next_due, None, "the only open one is held");
}

/// The warehouse loop knows when the next shipment falls due, and when it
/// knows of none it still looks once a second: shipments another
/// fulfillment process made (no notification reaches this one, and no
/// `order.confirmed` either, the relay being stopped) move on to delivery.
/// Counted two ways: the shipments' rows and their delivery events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warehouse_loop_delivers_shipments_it_was_never_told_of() {
    let mut saga = Saga::start_with(soldonce_tests::saga::SagaOptions {
        worker: false,
        ..Default::default()
    })
    .await;
    saga.stop_relay();
    saga.app.add_product("MUG", 2500, 10).await;
    // Nothing open at its first look: it knows of no shipment to wait for.
    saga.start_fulfillment(Duration::from_millis(100)).await;
    let mut shipments: Vec<uuid::Uuid> =
        soldonce_tests::saga::shipped_orders(&saga.app, "MUG", 2500, 3)
            .await
            .into_iter()
            .map(|(_, shipment)| shipment)
            .collect();
    shipments.sort();
    let app = &saga.app;
    soldonce_tests::eventually(
        "every shipment delivered",
        Duration::from_secs(30),
        || async {
            (app.count("SELECT count(*) FROM shipments WHERE state = 'delivered'")
                .await
                == 3)
                .then_some(())
        },
    )
    .await;
    let delivered: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT stream_id FROM events WHERE type = 'shipment.delivered.v1' ORDER BY stream_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("delivery events");
    assert_eq!(
        delivered, shipments,
        "one delivery event per shipment, no other"
    );
}

/// A shipment's warehouse steps before the last update its row in place
/// (HOT updates): no new entry in any of the table's indexes. Counted two
/// ways: PostgreSQL's counts of updates and HOT updates, and the entries
/// in the indexes' pages. The last step, to `delivered`, leaves the open
/// shipments, and so does write new entries.
#[tokio::test]
async fn a_shipments_steps_before_delivery_write_no_index_entries() {
    use store::shipments::advance_due;
    const N: i64 = 10;
    let app = soldonce_tests::TestApp::spawn().await;
    app.add_product("MUG", 2500, N).await;
    soldonce_tests::saga::shipped_orders(&app, "MUG", 2500, N as usize).await;
    let pool = soldonce_tests::one_connection_pool(&app.database_url).await;
    // Updates and HOT updates of shipments so far, and the entries in each index's one page.
    let counts = || {
        let pool = pool.clone();
        async move {
            sqlx::query("SELECT pg_stat_force_next_flush()")
                .execute(&pool)
                .await
                .expect("flush");
            let (updates, hot): (i64, i64) = sqlx::query_as(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'shipments'",
            )
            .fetch_one(&pool)
            .await
            .expect("updates");
            let entries = soldonce_tests::index_entries(
                &pool,
                &["shipments_pkey", "shipments_order_id_key", "shipments_open"],
            )
            .await;
            (updates, hot, entries)
        }
    };
    let (updates, hot, entries) = counts().await;
    assert_eq!(entries, [N, N, N], "one entry per shipment in each index");
    for step in ["picked", "shipped"] {
        let moved = advance_due(&pool, Duration::ZERO, 100, "test")
            .await
            .expect("a step");
        assert_eq!(moved.steps, N as u64, "every shipment {step}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM shipments WHERE state = 'shipped'")
            .await,
        N,
        "every shipment shipped"
    );
    let (u, h, e) = counts().await;
    assert_eq!(
        (u - updates, h - hot),
        (2 * N, 2 * N),
        "both steps of every shipment were HOT updates"
    );
    assert_eq!(e, [N, N, N], "the steps wrote no index entry");

    let delivered = advance_due(&pool, Duration::ZERO, 100, "test")
        .await
        .expect("the last step");
    assert_eq!(delivered.steps, N as u64);
    let (u, h, e) = counts().await;
    assert_eq!(
        (u - updates, h - hot),
        (3 * N, 2 * N),
        "delivery leaves the open shipments: not HOT"
    );
    assert_eq!(
        e,
        [2 * N, 2 * N, N],
        "delivery wrote a new entry in each unique index, none in the open shipments'"
    );
}

/// Two transactions shipping one order at once: the one that inserts
/// second waits for the first, then fails on the order's one shipment
/// (`shipments_order_id_key`, a plain insert with no `ON CONFLICT`) as a
/// lost race, `StoreError::Conflict`, which its consumer retries; never as
/// a database fault. One shipment and one `shipment.created` event remain.
#[tokio::test]
async fn a_second_shipment_of_one_order_at_once_is_a_lost_race_and_makes_nothing() {
    let app = soldonce_tests::TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let id = app.buy("MUG", 1).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        soldonce_tests::saga::pay_by_webhook(&app, &id, 2500).await,
        200,
        "paid"
    );
    let order: uuid::Uuid = id.parse().expect("uuid");
    let ship = |pool: sqlx::PgPool| async move {
        let mut tx = pool.begin().await.expect("tx");
        let meta = events::Metadata::from_request("test", order, None);
        let made = store::shipments::create_many(&mut tx, &[(order, meta)]).await;
        (tx, made)
    };
    let (first, made) = ship(app.pool.clone()).await;
    assert!(
        matches!(made.as_deref(), Ok([store::shipments::Created::New(_)])),
        "the first makes it: {made:?}"
    );
    let second = tokio::spawn(ship(app.pool.clone()));
    // The second waits on the first's uncommitted row in the unique index.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while app
        .count("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO shipments%'")
        .await
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the second never waited for the first"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.commit().await.expect("commit the first");
    let (_tx, made) = second.await.expect("the second");
    match made {
        Err(e) => assert!(e.is_conflict(), "a lost race, not {e:?}"),
        Ok(made) => panic!("the second made {made:?}"),
    }
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM shipments WHERE order_id = '{order}'"
        ))
        .await,
        1,
        "one shipment"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'shipment.created.v1'")
            .await,
        1,
        "one shipment.created event"
    );
}

/// The warehouse's look for due shipments runs every few tens of
/// milliseconds while shipments are open. On a new store `shipments` is
/// nearly empty when a connection first plans it; a plan kept from then
/// would read the whole grown table at each look. On 20,000 delivered
/// shipments the look reads none of them by scanning, where a statement
/// of the same shape, prepared on the small table, reads them all.
#[tokio::test]
async fn the_look_for_due_shipments_reads_no_delivered_one_however_the_table_grew() {
    use store::shipments::advance_due;
    const DIRECT: &str = "PREPARE direct AS SELECT s.id FROM shipments s \
                          WHERE s.open AND s.updated_at <= now() - interval '1 hour' \
                          ORDER BY s.updated_at LIMIT 10 FOR UPDATE SKIP LOCKED";
    let app = soldonce_tests::TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    soldonce_tests::saga::shipped_orders(&app, "MUG", 2500, 1).await;
    let pool =
        soldonce_tests::pool_on_frozen_statistics(&app.database_url, &["shipments"], &[DIRECT])
            .await;
    let step = Duration::from_secs(3600);
    // More looks than PostgreSQL's five custom plans before it may keep a generic one.
    for _ in 0..8 {
        let look = advance_due(&pool, step, 10, "test").await.expect("a look");
        assert_eq!(look.steps, 0, "nothing is due for an hour");
        sqlx::query("EXECUTE direct")
            .execute(&pool)
            .await
            .expect("the direct statement on the small table");
    }
    soldonce_tests::run_all(
        &pool,
        &[
            "INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000aa', 'grown')",
            "INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at) \
             SELECT md5(i::text)::uuid, '00000000-0000-0000-0000-0000000000aa', 'payment_pending', 'BRL', 100, 1, now(), now(), now() \
             FROM generate_series(1, 20000) i",
            "INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) \
             SELECT gen_random_uuid(), md5(i::text)::uuid, 'delivered', 4, now() - interval '2 days', now() - interval '2 days' \
             FROM generate_series(1, 20000) i",
        ],
    )
    .await;
    let before = soldonce_tests::rows_scanned(&pool, "shipments").await;
    let look = advance_due(&pool, step, 10, "test")
        .await
        .expect("a look on the grown table");
    let scanned = soldonce_tests::rows_scanned(&pool, "shipments").await - before;
    assert_eq!(look.steps, 0);
    assert!(
        look.next_due.is_some_and(|d| d > Duration::from_secs(3000)),
        "the one open shipment falls due in about an hour: {:?}",
        look.next_due
    );
    assert_eq!(scanned, 0, "the look on the grown table scans no shipment");
    soldonce_tests::assert_kept_plan_scans(&pool, "shipments", "EXECUTE direct").await;
}
