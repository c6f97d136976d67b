//! Abuse is input too: headers are parsed, never stored verbatim; each
//! account has a rate limit and limits on what it may hold (made-up tokens:
//! `tokens.rs`).

use futures::stream::{self, StreamExt};
use soldonce_tests::app::Buckets;
use soldonce_tests::TestApp;
use std::sync::Arc;
use uuid::Uuid;

fn one(sku: &str, quantity: i64) -> serde_json::Value {
    serde_json::json!({ "lines": [{ "sku": sku, "quantity": quantity }] })
}

async fn place_with_header(app: &TestApp, name: &str, value: &str) -> soldonce_tests::app::Reply {
    let request = app
        .client
        .post(app.url("/v1/orders"))
        .bearer_auth(&app.token)
        .header("idempotency-key", Uuid::new_v4().to_string())
        .header("content-type", "application/json")
        .header(name, value)
        .body(one("MUG", 1).to_string());
    app.send(request).await
}

#[tokio::test]
async fn an_oversized_or_malformed_traceparent_starts_a_fresh_trace_and_nothing_oversized_is_stored(
) {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let huge = format!("00-{}-00f067aa0ba902b7-01", "a".repeat(200_000));
    for bad in [
        huge.as_str(),
        "not-a-trace",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    ] {
        let placed = place_with_header(&app, "traceparent", bad).await;
        assert_eq!(placed.status, 202, "{}", placed.body);
        let id = placed.body["id"].as_str().expect("id");
        let stored: String =
            sqlx::query_scalar("SELECT traceparent FROM events WHERE stream_id = $1::uuid")
                .bind(id)
                .fetch_one(&app.pool)
                .await
                .expect("metadata");
        let fresh =
            platform::trace::TraceParent::parse(&stored).expect("a valid traceparent was stored");
        assert_eq!(fresh.to_string(), stored, "canonical, 55 characters");
        assert_ne!(stored, bad);
    }
    let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let placed = place_with_header(&app, "traceparent", valid).await;
    let kept: String =
        sqlx::query_scalar("SELECT traceparent FROM events WHERE stream_id = $1::uuid")
            .bind(placed.body["id"].as_str().expect("id"))
            .fetch_one(&app.pool)
            .await
            .expect("event metadata");
    // Continued: the same trace, under checkout's own span.
    assert_eq!(
        kept.get(..36),
        valid.get(..36),
        "a valid trace is continued"
    );
    assert_ne!(
        kept, valid,
        "the events name checkout's span, not the caller's"
    );
    assert!(
        platform::trace::TraceParent::parse(&kept).is_some(),
        "{kept}"
    );
    let largest: i64 =
        sqlx::query_scalar("SELECT max(length(e.metadata::text))::bigint FROM events e")
            .fetch_one(&app.pool)
            .await
            .expect("sizes");
    assert!(
        largest < 1_000,
        "nothing oversized stored: {largest} bytes of metadata"
    );
    // A head past the bound is refused whole, before anything reads it.
    let giant = place_with_header(&app, "x-padding", &"p".repeat(300_000)).await;
    giant.assert_problem(431);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 4);
}

#[tokio::test]
async fn an_account_over_its_rate_gets_429_with_retry_after_and_nothing_is_reserved() {
    let limits = checkout::Limits {
        account_rate: 1,
        account_burst: 3,
        ..checkout::Limits::unlimited()
    };
    let app = TestApp::spawn_with_limits(limits).await;
    app.add_product("MUG", 2500, 10).await;
    let mut statuses = vec![];
    for _ in 0..5 {
        let r = app.buy("MUG", 1).await;
        if r.status == 429 {
            r.assert_problem(429);
            let retry: u64 = r
                .header("retry-after")
                .expect("Retry-After")
                .parse()
                .expect("seconds");
            assert!((1..=2).contains(&retry), "{retry}");
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses, [202, 202, 202, 429, 429]);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 7,
            reserved: 3,
            sold: 0
        },
        "nothing reserved past the limit"
    );
    let (_, other) = app.new_account("someone else").await;
    assert_eq!(
        app.place(&other, "k", &one("MUG", 1)).await.status,
        202,
        "another account has its own budget"
    );
}

async fn concurrent_buys(app: &Arc<TestApp>, token: &str, sku: &str, n: usize) -> Vec<u16> {
    stream::iter(0..n)
        .map(|_| {
            let (app, token, sku) = (app.clone(), token.to_owned(), sku.to_owned());
            async move {
                app.place(&token, &Uuid::new_v4().to_string(), &one(&sku, 1))
                    .await
                    .status
            }
        })
        .buffer_unordered(300)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_per_customer_and_the_reservation_cap_hold_exactly_under_300_concurrent_requests() {
    let limits = checkout::Limits {
        max_reserved_units: 5,
        ..checkout::Limits::unlimited()
    };
    let app = Arc::new(TestApp::spawn_with_limits(limits).await);
    app.add_product("DROP", 100, 1_000).await;
    app.add_product("MUG", 100, 1_000).await;
    let set = std::process::Command::new(soldonce_tests::relay::binary("soldonce"))
        .args([
            "product",
            "limit",
            "--sku",
            "DROP",
            "--per-account",
            "1",
            "--max-per-order",
            "1",
        ])
        .env("DATABASE_URL", &app.database_url)
        .output()
        .expect("soldonce product limit");
    assert_eq!(
        set.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );

    let drop = concurrent_buys(&app, &app.token, "DROP", 300).await;
    assert_eq!(
        drop.iter().filter(|s| **s == 202).count(),
        1,
        "exactly one per customer"
    );
    assert_eq!(drop.iter().filter(|s| **s == 409).count(), 299);
    let two = app.place(&app.token, "two", &one("DROP", 2)).await;
    two.assert_problem(422);
    assert_eq!(two.body["limit"], 1);

    let mugs = concurrent_buys(&app, &app.token, "MUG", 300).await;
    assert_eq!(
        mugs.iter().filter(|s| **s == 202).count(),
        4,
        "5 units held at most: 1 DROP + 4 MUG"
    );
    let refused = app.place(&app.token, "over", &one("MUG", 1)).await;
    refused.assert_problem(409);
    assert_eq!(
        refused.body["type"],
        "urn:soldonce:problem:limit-reserved-units"
    );
    assert_eq!(
        app.buckets("DROP").await,
        Buckets {
            available: 999,
            reserved: 1,
            sold: 0
        }
    );
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 996,
            reserved: 4,
            sold: 0
        }
    );
    let bad = std::process::Command::new(soldonce_tests::relay::binary("soldonce"))
        .args(["product", "limit", "--sku", "DROP", "--per-account", "0"])
        .env("DATABASE_URL", &app.database_url)
        .output()
        .expect("soldonce product limit");
    assert_eq!(bad.status.code(), Some(2), "bad input is exit 2");
}

#[tokio::test]
async fn with_checkout_ops_addr_the_operations_endpoints_leave_the_public_port() {
    let db = soldonce_tests::servers::fresh_database().await;
    let ops_port = localservers::free_port().expect("port");
    let app = TestApp::spawn_configured(db, std::time::Duration::from_secs(900), |s| {
        s.ops_addr = Some(std::net::SocketAddr::from(([127, 0, 0, 1], ops_port)));
    })
    .await;
    for path in ["/metrics", "/readyz", "/healthz"] {
        let public = app.client.get(app.url(path)).send().await.expect("public");
        assert_eq!(public.status(), 404, "{path} is not on the public port");
        let ops = app
            .client
            .get(format!("http://127.0.0.1:{ops_port}{path}"))
            .send()
            .await
            .expect("ops");
        assert_eq!(ops.status(), 200, "{path} is on the ops port");
    }
    let ready: serde_json::Value = app
        .client
        .get(format!("http://127.0.0.1:{ops_port}/readyz"))
        .send()
        .await
        .expect("ops")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["status"], "ready");
    app.add_product("MUG", 100, 1).await;
    assert_eq!(app.buy("MUG", 1).await.status, 202, "the API still serves");
}
