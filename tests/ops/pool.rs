//! The store's connection pool: a connection the server dropped while it
//! sat in the pool never reaches the caller. (The pool checks each
//! connection as it hands it out; skipping the check for connections used
//! recently was measured twice and saved nothing: docs/benchmarks.md,
//! "Levers tried and left".)

use soldonce_tests::{eventually, servers};
use std::time::Duration;

#[tokio::test]
async fn a_connection_the_server_dropped_while_it_sat_in_the_pool_is_replaced_before_it_is_handed_out(
) {
    let url = servers::fresh_database().await;
    let pool = store::connect(&url, 1)
        .await
        .expect("a one-connection pool");
    let backend = || async {
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
    };
    let first = backend().await.expect("the pool's connection");
    assert_eq!(
        backend().await.expect("used again at once"),
        first,
        "one connection, kept"
    );
    let admin = soldonce_tests::one_connection_pool(&url).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&admin)
        .await
        .expect("terminate");
    assert!(terminated, "the pool's backend was there to terminate");
    eventually(
        "the terminated backend gone",
        Duration::from_secs(10),
        || async {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(first)
                    .fetch_one(&admin)
                    .await
                    .ok()?;
            (left == 0).then_some(())
        },
    )
    .await;
    let second = backend()
        .await
        .expect("no error: the connection was checked, found dead, and replaced");
    assert_ne!(second, first, "a new backend");
}
