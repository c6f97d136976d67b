//! The store's connection pool: a connection used within the last half
//! second is handed out as it is (no round trip before each transaction),
//! and one idle longer is pinged first, so a connection the server dropped
//! while it sat idle never reaches the caller.

use soldonce_tests::{eventually, servers};
use std::time::Duration;

#[tokio::test]
async fn a_connection_the_server_dropped_while_it_sat_idle_is_replaced_before_it_is_handed_out() {
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
    // Not a wait for something to happen: the connection must sit idle past
    // the half second within which it would be handed out unpinged.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = backend()
        .await
        .expect("no error: the idle connection was pinged, found dead, and replaced");
    assert_ne!(second, first, "a new backend");
}
