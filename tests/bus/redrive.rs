//! `soldonce dead-letters list|redrive`: a message a consumer gave up on is
//! sent again, once the cause is fixed, to that consumer alone, and handled
//! once however often the redrive runs.

use super::consumer::{count, envelope, publish, setup_at, start, wait_idle};
use bus::consumer::ConsumerSpec;
use soldonce_tests::eventually;
use soldonce_tests::relay::soldonce;
use std::time::Duration;
use uuid::Uuid;

/// Runs the CLI; asserts bad input is one line and exit 2.
fn refused(args: &[&str], env: &[(&str, &str)]) {
    let (code, said) = soldonce(args, env);
    assert_eq!(
        (code, said.trim().lines().count()),
        (Some(2), 1),
        "{args:?}: {said}"
    );
}

/// Runs the CLI with `--json`; asserts exit 0 and returns what it printed.
fn json(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend(args);
    let (code, said) = soldonce(&all, env);
    assert_eq!(code, Some(0), "{args:?}: {said}");
    serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {said}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redriven_dead_letter_is_handled_once_by_its_consumer_alone() {
    let bad = Uuid::now_v7();
    // The effect of one event is refused by the database until the test drops the check.
    let (url, pool, nats, js) = setup_at(&format!("CHECK (event_id <> '{bad}')")).await;
    // A bystander reads the same subjects: a redrive must never reach it.
    bus::consumer::ensure_consumer(
        &js,
        &ConsumerSpec {
            name: "bystander".into(),
            filter_subjects: vec!["soldonce.order.placed.>".into()],
            types: vec!["soldonce.order.placed.v1".into()],
            ack_wait: Duration::from_secs(5),
            max_deliver: 3,
            backoff: vec![],
            concurrency: 1,
            batching: bus::consumer::Batching {
                batch_size: 1,
                recorders: 1,
                linger: Duration::ZERO,
            },
        },
    )
    .await
    .expect("the bystander consumer");
    let (stop, runner) = start(&js, &pool, 4, 4);
    let good = Uuid::now_v7();
    publish(&js, "good", envelope(good, "soldonce.order.placed.v1")).await;
    publish(&js, "bad", envelope(bad, "soldonce.order.placed.v1")).await;
    publish(&js, "junk", b"{ not json".to_vec()).await;
    eventually("two dead letters", Duration::from_secs(30), || async {
        (count(&pool, "SELECT count(*) FROM dead_letters").await == 2).then_some(())
    })
    .await;
    wait_idle(&js, "test-consumer").await;
    let nats_url = nats.url();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("NATS_URL", nats_url.as_str()),
    ];

    // Listed: both, each with its reason; the failing one names its event.
    let listed = json(&["dead-letters", "list"], &env);
    let letters = listed.as_array().expect("a list");
    assert_eq!(letters.len(), 2, "{listed}");
    let bad_letter = letters
        .iter()
        .find(|l| l["event_id"] == bad.to_string())
        .unwrap_or_else(|| panic!("the failing event's letter in {listed}"));
    assert!(
        bad_letter["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("max deliveries reached")),
        "{bad_letter}"
    );
    assert_eq!(bad_letter["consumer"], "test-consumer");
    let bad_id = bad_letter["id"].as_i64().expect("id").to_string();

    // Bad input changes nothing.
    refused(&["dead-letters", "redrive", "--id", "999999"], &env);
    refused(&["dead-letters", "redrive", "--id", "x"], &env);
    refused(&["dead-letters", "redrive", "--id", &bad_id, "--all"], &env);
    refused(&["dead-letters", "redrive", "--consumer", "nobody"], &env);
    refused(&["dead-letters", "redrive"], &env);
    refused(
        &["dead-letters", "redrive", "--all"],
        &[("DATABASE_URL", url.as_str())],
    );
    let dry = json(&["dead-letters", "redrive", "--all", "--dry-run"], &env);
    assert_eq!(
        dry["report"]["redriven"].as_array().map(Vec::len),
        Some(2),
        "{dry}"
    );
    let outstanding = "SELECT count(*) FROM dead_letters WHERE redriven_at IS NULL";
    assert_eq!(count(&pool, outstanding).await, 2, "nothing redriven yet");

    // The cause fixed, the letter redriven: its effect, once.
    sqlx::query("ALTER TABLE test_effects DROP CONSTRAINT test_effects_event_id_check")
        .execute(&pool)
        .await
        .expect("fix the cause");
    let done = json(&["dead-letters", "redrive", "--id", &bad_id], &env);
    let redriven = &done["report"]["redriven"];
    assert_eq!(redriven.as_array().map(Vec::len), Some(1), "{done}");
    assert_eq!(
        redriven[0]["subject"],
        "soldonce.redrive.test-consumer.order.placed.test"
    );
    let handled = format!("SELECT count(*) FROM test_effects WHERE event_id = '{bad}'");
    eventually(
        "the redriven event's effect",
        Duration::from_secs(30),
        || async { (count(&pool, &handled).await == 1).then_some(()) },
    )
    .await;

    // Again: nothing more is sent, nothing more happens.
    let again = json(&["dead-letters", "redrive", "--id", &bad_id], &env);
    assert_eq!(
        again["report"]["redriven"],
        serde_json::json!([]),
        "{again}"
    );
    assert_eq!(again["already_redriven"][0]["id"].to_string(), bad_id);
    // The junk is sent too, and fails again: a new letter that names where it came from.
    let junk = json(
        &["dead-letters", "redrive", "--consumer", "test-consumer"],
        &env,
    );
    assert_eq!(
        junk["report"]["redriven"].as_array().map(Vec::len),
        Some(1),
        "{junk}"
    );
    eventually("the junk's new letter", Duration::from_secs(30), || async {
        (count(&pool, "SELECT count(*) FROM dead_letters").await == 3).then_some(())
    })
    .await;
    wait_idle(&js, "test-consumer").await;
    let listed = json(&["dead-letters", "list"], &env);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["original_subject"], "soldonce.order.placed.test");
    assert!(listed[0]["reason"]
        .as_str()
        .is_some_and(|r| r.starts_with("invalid envelope")));
    assert_eq!(count(&pool, outstanding).await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM test_effects").await,
        2,
        "good and bad, once each"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox WHERE consumer = 'test-consumer'"
        )
        .await,
        2
    );
    // The bystander was offered the three messages published, never a redrive.
    let mut bystander = js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            "bystander",
            bus::STREAM,
        )
        .await
        .expect("bystander");
    assert_eq!(bystander.info().await.expect("info").num_pending, 3);
    stop.send(true).expect("stop");
    runner.await.expect("runner").expect("consumer ran cleanly");
}
