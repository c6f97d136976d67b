//! The webhook receiver trusts only what is signed, and applies each webhook once.

use soldonce_tests::app::{Buckets, WEBHOOK_SECRET};
use soldonce_tests::TestApp;
use std::time::Duration;

struct Hook<'a> {
    id: &'a str,
    ts: i64,
    body: String,
    signature: Option<String>,
}

pub(super) fn signed(secret: &str, id: &str, ts: i64, body: &str) -> String {
    let secret = psp_sim::signature::WebhookSecret::parse(secret).expect("secret");
    psp_sim::signature::sign(&secret, id, ts, body.as_bytes())
}

async fn deliver(app: &TestApp, hook: &Hook<'_>) -> u16 {
    let mut req = app
        .client
        .post(app.url("/v1/psp/webhooks"))
        .header("webhook-id", hook.id)
        .header("webhook-timestamp", hook.ts.to_string())
        .body(hook.body.clone());
    if let Some(sig) = &hook.signature {
        req = req.header("webhook-signature", sig);
    }
    app.send(req).await.status
}

fn success_body(order_id: &str, amount: i64) -> String {
    payment_success_body("pay_test1", order_id, amount)
}

pub(super) fn payment_success_body(payment_id: &str, order_id: &str, amount: i64) -> String {
    serde_json::json!({ "type": "payment.succeeded", "timestamp": chrono::Utc::now(), "data": {
        "id": payment_id, "status": "succeeded", "amount_minor": amount, "currency": "BRL", "reference": order_id,
        "idempotency_key": format!("pay:{order_id}"), "failure_reason": null, "created_at": chrono::Utc::now(), "refunds": [] } })
    .to_string()
}

#[tokio::test]
async fn forged_stale_or_malformed_webhooks_are_401_and_change_nothing() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 5).await;
    let order = app.buy("MUG", 1).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let now = chrono::Utc::now().timestamp();
    let body = success_body(&order, 2500);
    let other_secret = "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCBrZXkgISE=";
    let cases = [
        (
            "unsigned",
            Hook {
                id: "msg_1",
                ts: now,
                body: body.clone(),
                signature: None,
            },
        ),
        (
            "wrong secret",
            Hook {
                id: "msg_2",
                ts: now,
                body: body.clone(),
                signature: Some(signed(other_secret, "msg_2", now, &body)),
            },
        ),
        (
            "tampered body",
            Hook {
                id: "msg_3",
                ts: now,
                body: body.replace("2500", "1"),
                signature: Some(signed(WEBHOOK_SECRET, "msg_3", now, &body)),
            },
        ),
        (
            "stale",
            Hook {
                id: "msg_4",
                ts: now - 600,
                body: body.clone(),
                signature: Some(signed(WEBHOOK_SECRET, "msg_4", now - 600, &body)),
            },
        ),
        (
            "future",
            Hook {
                id: "msg_5",
                ts: now + 600,
                body: body.clone(),
                signature: Some(signed(WEBHOOK_SECRET, "msg_5", now + 600, &body)),
            },
        ),
        (
            "malformed header",
            Hook {
                id: "msg_6",
                ts: now,
                body: body.clone(),
                signature: Some("v1;not-base64!".into()),
            },
        ),
    ];
    for (what, hook) in &cases {
        assert_eq!(deliver(&app, hook).await, 401, "{what}");
    }
    let order_state = app
        .get(&app.token, &format!("/v1/orders/{order}"))
        .await
        .body["state"]
        .clone();
    assert_eq!(order_state, "payment_pending");
    assert_eq!(app.count("SELECT count(*) FROM webhook_receipts").await, 0);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("soldonce_webhooks_rejected_total"),
        "rejections are counted"
    );

    // The genuine one, signed among a rotated-out signature, is applied once.
    let sig = format!(
        "{} {}",
        signed(other_secret, "msg_ok", now, &body),
        signed(WEBHOOK_SECRET, "msg_ok", now, &body)
    );
    let genuine = Hook {
        id: "msg_ok",
        ts: now,
        body: body.clone(),
        signature: Some(sig),
    };
    assert_eq!(deliver(&app, &genuine).await, 200);
    assert_eq!(
        deliver(&app, &genuine).await,
        200,
        "a repeat is acknowledged"
    );
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'order.confirmed.v1'")
            .await,
        1
    );
}

/// An HMAC-SHA256 Standard Webhooks signature with any key, even one no secret parser accepts.
fn signed_with_key(key: &[u8], id: &str, ts: i64, body: &str) -> String {
    use base64::Engine;
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body.as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

#[tokio::test]
async fn webhooks_signed_with_the_old_compose_secret_an_empty_key_or_absurd_timestamps_are_401_without_a_panic(
) {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 5).await;
    let order = app.buy("MUG", 1).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let now = chrono::Utc::now().timestamp();
    let body = success_body(&order, 2500);
    let old_compose = "whsec_c29sZG9uY2UtY29tcG9zZS1kZW1vLXNlY3JldA==";
    let cases = [
        (
            "the secret compose used to ship",
            Hook {
                id: "msg_a",
                ts: now,
                body: body.clone(),
                signature: Some(signed(old_compose, "msg_a", now, &body)),
            },
        ),
        (
            "an empty key",
            Hook {
                id: "msg_b",
                ts: now,
                body: body.clone(),
                signature: Some(signed_with_key(b"", "msg_b", now, &body)),
            },
        ),
        (
            "i64::MIN",
            Hook {
                id: "msg_c",
                ts: i64::MIN,
                body: body.clone(),
                signature: Some(signed(WEBHOOK_SECRET, "msg_c", i64::MIN, &body)),
            },
        ),
        (
            "i64::MAX",
            Hook {
                id: "msg_d",
                ts: i64::MAX,
                body: body.clone(),
                signature: Some(signed(WEBHOOK_SECRET, "msg_d", i64::MAX, &body)),
            },
        ),
        (
            "replayed after its window",
            Hook {
                id: "msg_e",
                ts: now - 301,
                body: body.clone(),
                signature: Some(signed(WEBHOOK_SECRET, "msg_e", now - 301, &body)),
            },
        ),
    ];
    for (what, hook) in &cases {
        assert_eq!(deliver(&app, hook).await, 401, "{what}");
    }
    assert_eq!(
        app.get(&app.token, &format!("/v1/orders/{order}"))
            .await
            .body["state"],
        "payment_pending",
        "nothing changed"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_receipts").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM payments").await, 0);
    // Still serving: nothing panicked.
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("healthz")
            .status(),
        200
    );
}

#[tokio::test]
async fn a_webhook_whose_order_another_decider_holds_is_answered_503_at_once_and_its_redelivery_confirms(
) {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 5).await;
    let placed = app.buy("MUG", 1).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let order_id = placed.body["id"].as_str().expect("id").to_owned();
    let id: uuid::Uuid = order_id.parse().expect("uuid");
    let body = success_body(&order_id, 2500);
    let send = |webhook_id: &'static str| {
        let ts = chrono::Utc::now().timestamp();
        app.client
            .post(app.url("/v1/psp/webhooks"))
            .header("webhook-id", webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                signed(WEBHOOK_SECRET, webhook_id, ts, &body),
            )
            .body(body.clone())
    };

    // Another decider (as the payment worker recording this payment) holds the order's row.
    let mut holder = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM orders WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *holder)
        .await
        .expect("lock the order");
    // Answered at once, not after the holder commits: a webhook that queued
    // would hold up the decider's batch and every consumer behind it.
    let busy = tokio::time::timeout(Duration::from_secs(10), app.send(send("msg_busy")))
        .await
        .expect("a webhook must not wait for the order's decider");
    busy.assert_problem(503);
    assert_eq!(busy.header("retry-after"), Some("1"));
    for (table, sql) in [
        ("receipts", "SELECT count(*) FROM webhook_receipts"),
        ("payments", "SELECT count(*) FROM payments"),
        (
            "events",
            "SELECT count(*) FROM events WHERE type = 'order.confirmed.v1'",
        ),
    ] {
        assert_eq!(app.count(sql).await, 0, "a busy webhook wrote {table}");
    }
    holder.rollback().await.expect("release the order");

    // The PSP delivers it again (same webhook id): it is learned now.
    assert_eq!(app.send(send("msg_busy")).await.status, 200);
    assert_eq!(
        app.count("SELECT count(*) FROM payments WHERE disposition = 'attached'")
            .await,
        1
    );
    let order = app.get(&app.token, &format!("/v1/orders/{order_id}")).await;
    assert_eq!(order.body["state"], "confirmed", "{}", order.body);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 4,
            reserved: 0,
            sold: 1
        }
    );
}

/// The webhook path asks which payments are already recorded, many at
/// once, on connections that live as long as checkout. A statement kept
/// prepared would keep a plan made while `payments` was empty, a scan,
/// and read every payment at each look as the table grew. The look runs in
/// a function that plans it at each call: after more than five looks on an
/// empty, analyzed table, a look on 20,000 payments reads none of them by
/// scanning and answers exactly the recorded ones, where the same
/// statement prepared on its own reads them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_look_for_recorded_payments_probes_their_keys_however_the_table_grew() {
    let app = TestApp::spawn().await;
    let pool = soldonce_tests::pool_on_frozen_statistics(
        &app.database_url,
        &["payments"],
        &["PREPARE direct(text[]) AS SELECT p.payment_id FROM payments p WHERE p.payment_id = ANY($1)"],
    )
    .await;
    for _ in 0..7 {
        let known = store::payments::known_among(&pool, &["pay-a", "pay-b"])
            .await
            .expect("a look on the empty table");
        assert!(known.is_empty());
        sqlx::query("EXECUTE direct(ARRAY['pay-a', 'pay-b'])")
            .execute(&pool)
            .await
            .expect("the direct statement on the empty table");
    }
    sqlx::query(
        "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from) \
         SELECT 'pay-old-' || i, gen_random_uuid(), 100, 'BRL', 'attached', 'worker' FROM generate_series(1, 20000) i",
    )
    .execute(&pool)
    .await
    .expect("payments grow");

    let before = soldonce_tests::rows_scanned(&pool, "payments").await;
    let known = store::payments::known_among(&pool, &["pay-old-7", "pay-never", "pay-old-19999"])
        .await
        .expect("a look on the grown table");
    let scanned = soldonce_tests::rows_scanned(&pool, "payments").await - before;
    let mut known: Vec<String> = known.into_iter().collect();
    known.sort();
    assert_eq!(
        known,
        ["pay-old-19999", "pay-old-7"],
        "exactly the recorded ones"
    );
    assert_eq!(scanned, 0, "the look reads no payment by scanning");

    soldonce_tests::assert_kept_plan_scans(&pool, "payments", "EXECUTE direct(ARRAY['pay-old-7'])")
        .await;
}
