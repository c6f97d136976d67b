//! Connection hygiene on checkout's public port: stalled heads, stalled
//! bodies and idle keep-alive connections are closed by the server, and a
//! placement that cannot get a lane in time is a 503 that reserved nothing.

use futures::future::join_all;
use soldonce_tests::{servers, TestApp};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A checkout whose connection limits `http` adjusts.
async fn checkout(http: impl FnOnce(&mut checkout::HttpLimits)) -> TestApp {
    TestApp::spawn_configured(
        servers::fresh_database().await,
        Duration::from_secs(900),
        |s| http(&mut s.http),
    )
    .await
}

/// Reads until the server closes the connection (EOF or reset), at most
/// `within`: how long that took, or `None` if it was still open. What was
/// read comes back too.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Option<Duration>, Vec<u8>) {
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = within.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return (None, seen),
            Ok(Ok(0) | Err(_)) => return (Some(started.elapsed()), seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect to checkout")
}

/// The 800 connections of issue 38, each sending half a request head and
/// stopping, are closed by the server within its header-read timeout, and
/// a buyer arriving among them is still served in under 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_hundred_half_sent_heads_are_closed_and_a_buyer_is_served() {
    let timeout = Duration::from_secs(1);
    let app = checkout(|h| {
        h.header_read_timeout = timeout;
        h.idle_timeout = Duration::from_secs(60);
    })
    .await;
    app.add_product("MUG", 2500, 10).await;
    let opened = Instant::now();
    let mut stalled = join_all((0..800).map(|_| async {
        let mut s = connect(app.addr).await;
        s.write_all(b"POST /v1/orders HTTP/1.1\r\nHost: checkout\r\nContent-Ty")
            .await
            .expect("half a head");
        s
    }))
    .await;
    let asked = Instant::now();
    let bought = app.buy("MUG", 1).await;
    let served_in = asked.elapsed();
    assert_eq!(bought.status, 202, "{}", bought.body);
    assert!(
        served_in < Duration::from_secs(2),
        "served in {served_in:?}"
    );
    // Each is closed within the timeout (plus scheduling slack on a busy
    // machine), counted from when it was opened.
    let closed = join_all(
        stalled
            .iter_mut()
            .map(|s| until_closed(s, timeout + Duration::from_secs(5))),
    )
    .await;
    let open = closed.iter().filter(|(c, _)| c.is_none()).count();
    assert_eq!(open, 0, "{open} of 800 stalled connections still open");
    let slowest = opened.elapsed();
    assert!(
        slowest < timeout + Duration::from_secs(4),
        "the last closed after {slowest:?}"
    );
    assert_eq!(app.buckets("MUG").await.reserved, 1);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

/// A keep-alive connection left idle after its request is closed after the
/// idle timeout, well before the header-read timeout would close it.
#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let app = checkout(|h| {
        h.header_read_timeout = Duration::from_secs(30);
        h.idle_timeout = Duration::from_millis(500);
    })
    .await;
    let mut s = connect(app.addr).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: checkout\r\n\r\n")
        .await
        .expect("request");
    let (closed, seen) = until_closed(&mut s, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let closed = closed.expect("closed by the server");
    assert!(
        closed >= Duration::from_millis(400) && closed < Duration::from_secs(5),
        "closed after {closed:?}"
    );
}

/// A body that stops arriving fails its request after the body timeout:
/// a 4xx problem, and nothing placed.
#[tokio::test]
async fn a_stalled_request_body_fails_after_the_body_timeout() {
    let app = checkout(|h| h.body_timeout = Duration::from_millis(500)).await;
    app.add_product("MUG", 2500, 10).await;
    let mut s = connect(app.addr).await;
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: checkout\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"lines\":",
        app.token
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let (closed, seen) = until_closed(&mut s, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&seen);
    assert!(closed.is_some(), "still open");
    assert!(text.starts_with("HTTP/1.1 4"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 0);
    assert_eq!(app.buckets("MUG").await.reserved, 0);
}

/// A placement that waits for a lane past the deadline hears 503 with
/// Retry-After and reserves nothing; retried with its key, it is placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_waiting_past_the_lane_deadline_is_a_503_that_reserved_nothing() {
    let app = std::sync::Arc::new(
        TestApp::spawn_configured(
            servers::fresh_database().await,
            Duration::from_secs(900),
            |s| {
                s.coalesce.lanes = 1;
                s.coalesce.queue_deadline = Duration::from_millis(300);
            },
        )
        .await,
    );
    app.add_product("MUG", 2500, 10).await;
    let body = serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] });
    // The only lane blocks on the stock row another transaction holds.
    let (held, pid) = app.hold_stock_row("MUG").await;
    let first = {
        let (app, body) = (app.clone(), body.clone());
        tokio::spawn(async move { app.place(&app.token, "first", &body).await })
    };
    app.wait_blocked_by(pid, "the lane to wait on the stock row")
        .await;
    let late = app.place(&app.token, "late", &body).await;
    late.assert_problem(503);
    assert_eq!(late.body["type"], "urn:soldonce:problem:overloaded");
    assert_eq!(late.header("retry-after"), Some("1"));
    held.rollback().await.expect("release the row");
    let first = first.await.expect("first buyer");
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'late'")
            .await,
        0,
        "the late request stored nothing"
    );
    assert_eq!(app.buckets("MUG").await.reserved, 1);
    let again = app.place(&app.token, "late", &body).await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(app.buckets("MUG").await.reserved, 2);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 2);
}
