//! Upgrades that convert data: a database of the release before, with rows
//! written as it wrote them, migrated to this release.

use soldonce_tests::servers;
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use std::borrow::Cow;
use uuid::Uuid;

/// The migrations up to and including `version`, as a migrator of their own.
fn migrations_through(version: i64) -> Migrator {
    let mut through = Migrator {
        migrations: Cow::Owned(
            store::MIGRATOR
                .iter()
                .filter(|m| m.version <= version)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    };
    through.set_locking(true);
    through
}

/// Events recorded while their metadata was a JSON object keep every field
/// of it as columns; one written by hand with metadata that says less takes
/// its stream as its saga, itself as its cause and `unknown` as its source;
/// and `e.metadata` still reads each as the object it was.
#[tokio::test]
async fn events_recorded_before_the_metadata_became_columns_keep_it() {
    let url = servers::empty_database().await;
    let pool = PgPool::connect(&url).await.expect("connect");
    migrations_through(20261212000030)
        .run(&pool)
        .await
        .expect("the release before");
    let (stream, saga, cause) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let written = [
        serde_json::json!({ "correlation_id": saga, "causation_id": cause, "source": "checkout", "traceparent": parent, "tracestate": "k=v" }),
        serde_json::json!({ "correlation_id": saga, "causation_id": cause, "source": "fulfillment" }),
        serde_json::json!({}),
        serde_json::json!({ "correlation_id": "not an id", "source": 7 }),
        serde_json::json!(["not", "an", "object"]),
    ];
    let mut ids = Vec::new();
    for (version, metadata) in (1..).zip(&written) {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO events (event_id, stream_id, version, type, data, metadata) VALUES ($1, $2, $3, 'order.test.v1', '{}', $4)",
        )
        .bind(id)
        .bind(stream)
        .bind(version)
        .bind(metadata)
        .execute(&pool)
        .await
        .expect("an event as the release before wrote it");
        ids.push(id);
    }
    store::migrate(&pool).await.expect("this release");

    type Columns = (
        Uuid,
        Uuid,
        Uuid,
        String,
        Option<String>,
        Option<String>,
        serde_json::Value,
    );
    let rows: Vec<Columns> = sqlx::query_as(
        "SELECT e.event_id, e.correlation_id, e.causation_id, e.source, e.traceparent, e.tracestate, e.metadata \
         FROM events e ORDER BY e.version",
    )
    .fetch_all(&pool)
    .await
    .expect("the events after the upgrade");
    assert_eq!(rows.len(), written.len(), "every event kept");
    let kept = |row: &Columns| (row.1, row.2, row.3.clone(), row.4.clone(), row.5.clone());
    assert_eq!(
        kept(&rows[0]),
        (
            saga,
            cause,
            "checkout".into(),
            Some(parent.into()),
            Some("k=v".into())
        )
    );
    assert_eq!(
        kept(&rows[1]),
        (saga, cause, "fulfillment".into(), None, None)
    );
    for (row, id) in rows[2..].iter().zip(&ids[2..]) {
        assert_eq!(
            kept(row),
            (stream, *id, "unknown".into(), None, None),
            "stand-ins for metadata that says less"
        );
    }
    assert_eq!(
        rows[0].6, written[0],
        "e.metadata reads as the object it was"
    );
    assert_eq!(rows[1].6, written[1]);
    let meta: events::Metadata =
        serde_json::from_value(rows[3].6.clone()).expect("readable metadata now");
    assert_eq!(meta.source, "unknown");
}

/// Outbox rows waiting when the outbox became a row per writing statement
/// become one-event rows under the transaction that wrote their event, and
/// the claim takes them in order: an order's second event waits behind its
/// first, whichever row holds it.
#[tokio::test]
async fn outbox_rows_waiting_at_the_upgrade_to_rows_per_statement_are_claimed_in_order() {
    let url = servers::empty_database().await;
    let pool = PgPool::connect(&url).await.expect("connect");
    migrations_through(20261215000037)
        .run(&pool)
        .await
        .expect("the release before");
    let (order, other) = (Uuid::now_v7(), Uuid::now_v7());
    let mut positions = Vec::new();
    for (stream, version) in [(order, 1), (other, 1), (order, 2)] {
        let position: i64 = sqlx::query_scalar(
            "WITH e AS ( \
                 INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source) \
                 VALUES (gen_random_uuid(), $1, $2, 'order.test.v1', '{}', gen_random_uuid(), gen_random_uuid(), 'test') \
                 RETURNING position) \
             INSERT INTO outbox (position) SELECT position FROM e RETURNING position",
        )
        .bind(stream)
        .bind(version)
        .fetch_one(&pool)
        .await
        .expect("an event and its outbox row as the release before wrote them");
        positions.push(position);
    }
    store::migrate(&pool).await.expect("this release");

    let rows: Vec<(i64, Vec<i64>, bool)> = sqlx::query_as(
        "SELECT o.position, o.positions, o.tx = e.xmin::text::bigint \
         FROM outbox o JOIN events e ON e.position = o.position ORDER BY o.position",
    )
    .fetch_all(&pool)
    .await
    .expect("rows after the upgrade");
    assert_eq!(
        rows,
        positions
            .iter()
            .map(|p| (*p, vec![*p], true))
            .collect::<Vec<_>>(),
        "one-event rows under their event's transaction"
    );
    assert_eq!(store::outbox::backlog(&pool).await.expect("backlog").0, 3);
    let claim = |pool: PgPool| async move {
        let mut tx = pool.begin().await.expect("begin");
        let claimed = store::outbox::claim(&mut tx, 10, &[]).await.expect("claim");
        let got: Vec<i64> = claimed.rows.iter().map(|r| r.message.position).collect();
        (tx, got)
    };
    let (mut tx, got) = claim(pool.clone()).await;
    assert_eq!(
        got,
        [positions[0], positions[1]],
        "the order's second event waits behind its first"
    );
    store::outbox::delete(&mut tx, &got, positions[1], &[])
        .await
        .expect("delete");
    tx.commit().await.expect("commit");
    let (tx, got) = claim(pool.clone()).await;
    assert_eq!(got, [positions[2]]);
    tx.rollback().await.expect("rollback");
}
