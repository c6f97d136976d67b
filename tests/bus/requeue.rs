//! `soldonce outbox parked|requeue`: an event the relay parked is listed
//! with its reason and, once the cause is fixed, put back and published
//! exactly once, however often the requeue runs.

use super::poison::stream_sequences;
use localservers::Nats;
use soldonce_tests::relay::{soldonce, spawn_in_process};
use soldonce_tests::{eventually, TestApp};
use std::time::Duration;
use uuid::Uuid;

/// Sets the stream's own message size limit (-1: none).
async fn limit_message_size(js: &async_nats::jetstream::Context, bytes: i32) {
    let mut config = soldonce_tests::relay::stream_config(js).await;
    config.max_message_size = bytes;
    js.update_stream(config)
        .await
        .expect("set the stream's message size limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_event_requeued_after_the_fix_is_published_once() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 100, 10).await;
    let nats = Nats::start_temporary().expect("private nats");
    let _relay = spawn_in_process(&app.database_url, &nats.url()).await;
    let js = bus::connect(&nats.url()).await.expect("connect nats");
    // Every normal event fits; one with a long shipping address does not.
    limit_message_size(&js, 1200).await;
    let long = "x".repeat(200);
    let body = serde_json::json!({
        "lines": [{ "sku": "MUG", "quantity": 1 }],
        "shipping": { "name": long, "line1": long, "city": long, "postal_code": long, "country": "BR" }
    });
    let placed = app.place(&app.token, "big", &body).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let order: Uuid = placed.body["id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    assert_eq!(app.buy("MUG", 1).await.status, 202);
    eventually(
        "the big event to be parked",
        Duration::from_secs(30),
        || async {
            (app.count("SELECT count(*) FROM outbox").await == 0
                && app.count("SELECT count(*) FROM outbox_parked").await == 1)
                .then_some(())
        },
    )
    .await;
    let event: Uuid = sqlx::query_scalar("SELECT event_id FROM events WHERE stream_id = $1")
        .bind(order)
        .fetch_one(&app.pool)
        .await
        .expect("the order's event");
    let env = [("DATABASE_URL", app.database_url.as_str())];
    let run = |args: &[&str]| -> (Option<i32>, String) { soldonce(args, &env) };

    let (code, said) = run(&["--json", "outbox", "parked"]);
    assert_eq!(code, Some(0), "{said}");
    let parked: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(parked.as_array().map(Vec::len), Some(1), "{parked}");
    assert_eq!(
        (
            &parked[0]["id"],
            &parked[0]["stream_id"],
            &parked[0]["reason"]
        ),
        (
            &serde_json::json!(event),
            &serde_json::json!(order),
            &serde_json::json!("too_large")
        )
    );

    // Bad input: one line, exit 2, nothing moved.
    let unknown = Uuid::now_v7().to_string();
    let event_id = event.to_string();
    for args in [
        vec!["outbox", "requeue", "--id", unknown.as_str()],
        vec!["outbox", "requeue", "--id", "not-a-uuid"],
        vec!["outbox", "requeue", "--id", event_id.as_str(), "--all"],
        vec!["outbox", "requeue"],
    ] {
        let (code, said) = run(&args);
        assert_eq!(
            (code, said.trim().lines().count()),
            (Some(2), 1),
            "{args:?}: {said}"
        );
    }
    // A row parked as the upgrade to outbox rows that name their events
    // left one that named none: nothing to publish it from.
    let orphan = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO outbox_parked (id, position, stream_id, subject, payload, created_at, reason) \
         VALUES ($1, -1, $1, 'soldonce.bench.event.1', '{}', now(), 'no_event')",
    )
    .bind(orphan)
    .execute(&app.pool)
    .await
    .expect("a parked row with no event");
    let (code, said) = run(&["--json", "outbox", "requeue", "--all", "--dry-run"]);
    assert_eq!(code, Some(0), "{said}");
    let would: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(
        (&would["requeued"], &would["no_event"]),
        (&serde_json::json!([event]), &serde_json::json!([orphan])),
        "{would}"
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_parked").await, 2);
    assert!(!stream_sequences(&nats.url()).await.contains_key(&event));

    // The cause fixed, the event requeued: published, once; the row with no event stays, named.
    limit_message_size(&js, -1).await;
    let (code, said) = run(&["--json", "outbox", "requeue", "--all"]);
    assert_eq!(code, Some(0), "{said}");
    let done: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(
        (&done["requeued"], &done["no_event"]),
        (&serde_json::json!([event]), &serde_json::json!([orphan])),
        "{done}"
    );
    let (code, said) = run(&["outbox", "requeue", "--id", &orphan.to_string()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("parked row {orphan} names no event")),
        "{said}"
    );
    eventually(
        "the requeued event in the stream",
        Duration::from_secs(30),
        || async {
            let seen = stream_sequences(&nats.url()).await;
            seen.contains_key(&event).then_some(())
        },
    )
    .await;
    eventually("the outbox to drain", Duration::from_secs(30), || async {
        (app.count("SELECT count(*) FROM outbox").await == 0).then_some(())
    })
    .await;
    // Again: nothing to move, nothing published twice.
    let (code, said) = run(&["--json", "outbox", "requeue", "--id", &event_id]);
    assert_eq!(code, Some(0), "{said}");
    let again: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(
        (&again["requeued"], &again["not_parked"]),
        (&serde_json::json!([]), &serde_json::json!([event])),
        "{again}"
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_parked WHERE reason = 'no_event'")
            .await,
        1,
        "only the row with no event is left parked"
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_parked").await, 1);
    let seen = stream_sequences(&nats.url()).await;
    assert_eq!(seen.get(&event).map(Vec::len), Some(1), "published once");
    assert_eq!(
        seen.len() as i64,
        app.count("SELECT count(*) FROM events").await,
        "every event in the stream"
    );
}
