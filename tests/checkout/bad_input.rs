//! Bad input gets a clear 4xx problem, never a 5xx, and changes nothing.

use serde_json::json;
use soldonce_tests::app::Buckets;
use soldonce_tests::TestApp;

#[tokio::test]
async fn every_kind_of_bad_order_is_a_4xx_problem_and_reserves_nothing() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let line = |q: serde_json::Value| json!({ "lines": [{ "sku": "MUG", "quantity": q }] });
    let too_many: Vec<_> = (0..101)
        .map(|i| json!({ "sku": format!("S{i}"), "quantity": 1 }))
        .collect();
    let cases: Vec<(&str, String, u16)> = vec![
        ("malformed JSON", "{\"lines\": [".into(), 400),
        ("not an object", "[]".into(), 422),
        ("unknown top-level field", json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "coupon": "X" }).to_string(), 422),
        ("client-supplied price", json!({ "lines": [{ "sku": "MUG", "quantity": 1, "unit_price_minor": 1 }] }).to_string(), 422),
        ("client-supplied total", json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "total_minor": 1 }).to_string(), 422),
        ("unknown sku", json!({ "lines": [{ "sku": "NOPE", "quantity": 1 }] }).to_string(), 422),
        ("invalid sku", json!({ "lines": [{ "sku": "no spaces", "quantity": 1 }] }).to_string(), 422),
        ("quantity 0", line(json!(0)).to_string(), 422),
        ("negative quantity", line(json!(-3)).to_string(), 422),
        ("quantity beyond i64", "{\"lines\":[{\"sku\":\"MUG\",\"quantity\":99999999999999999999999}]}".into(), 422),
        ("fractional quantity", line(json!(1.5)).to_string(), 422),
        ("quantity as text", line(json!("1")).to_string(), 422),
        ("no lines", json!({ "lines": [] }).to_string(), 422),
        ("missing lines", json!({}).to_string(), 422),
        ("too many lines", json!({ "lines": too_many }).to_string(), 422),
        ("duplicate sku", json!({ "lines": [{ "sku": "MUG", "quantity": 1 }, { "sku": "MUG", "quantity": 1 }] }).to_string(), 422),
        ("bad shipping country", json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "shipping": { "name": "A", "line1": "B", "city": "C", "postal_code": "D", "country": "Brazil" } }).to_string(), 422),
        ("unknown shipping field", json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "shipping": { "name": "A", "line1": "B", "city": "C", "postal_code": "D", "country": "BR", "phone": "1" } }).to_string(), 422),
        ("oversized body", format!("{{\"lines\":[],\"pad\":\"{}\"}}", "x".repeat(100_000)), 413),
    ];
    for (i, (what, body, status)) in cases.into_iter().enumerate() {
        let reply = app
            .send(
                app.client
                    .post(app.url("/v1/orders"))
                    .bearer_auth(&app.token)
                    .header("idempotency-key", format!("bad-{i}"))
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await;
        assert_eq!(reply.status, status, "{what}: {}", reply.body);
        reply.assert_problem(status);
    }
    let wrong_type = app
        .send(
            app.client
                .post(app.url("/v1/orders"))
                .bearer_auth(&app.token)
                .header("idempotency-key", "text")
                .header("content-type", "text/plain")
                .body(line(json!(1)).to_string()),
        )
        .await;
    wrong_type.assert_problem(415);
    assert_eq!(
        app.buckets("MUG").await,
        Buckets {
            available: 10,
            reserved: 0,
            sold: 0
        }
    );
    assert_eq!(
        app.ledger("MUG").await,
        Buckets {
            available: 10,
            reserved: 0,
            sold: 0
        }
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);
}

#[tokio::test]
async fn a_shipping_address_is_kept_with_the_order() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let shipping = json!({ "name": "Ana", "line1": "Rua A, 1", "city": "Recife", "postal_code": "50000-000", "country": "BR" });
    let body = json!({ "lines": [{ "sku": "MUG", "quantity": 2 }], "shipping": shipping });
    let placed = app.place(&app.token, "ship", &body).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    assert_eq!(placed.body["shipping"], shipping);
    assert_eq!(
        placed.body["total_minor"], 5000,
        "priced from the catalogue"
    );
    assert_eq!(placed.body["currency"], "BRL");
}

/// A NUL (which PostgreSQL cannot store) or any other control character in
/// an address field is the client's error: `422` naming the field, before
/// anything reaches the database.
#[tokio::test]
async fn a_control_character_in_any_address_field_is_a_422_naming_it() {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 10).await;
    let address = json!({ "name": "Ana Silva", "line1": "Rua A, 1", "city": "Recife", "postal_code": "50000-000", "country": "BR" });
    let mut sent = 0;
    for field in ["name", "line1", "city", "postal_code", "country"] {
        for bad in [
            "\u{0}", "\n", "\t", "\u{1b}", "\u{7f}", "\u{85}", "\u{2028}",
        ] {
            let mut shipping = address.clone();
            let clean = shipping[field].as_str().expect("text").to_owned();
            let (head, tail) = clean.split_at(1);
            shipping[field] = json!(format!("{head}{bad}{tail}"));
            let body = json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "shipping": shipping });
            let reply = app.place(&app.token, &format!("ctl-{sent}"), &body).await;
            sent += 1;
            reply.assert_problem(422);
            assert_eq!(
                reply.body["field"],
                format!("shipping.{field}"),
                "{bad:?} in {field}: {}",
                reply.body
            );
        }
    }
    assert_eq!(sent, 35);
    let untouched = Buckets {
        available: 10,
        reserved: 0,
        sold: 0,
    };
    assert_eq!(app.buckets("MUG").await, untouched);
    assert_eq!(app.ledger("MUG").await, untouched);
    for table in ["orders", "events", "outbox", "idempotency_keys"] {
        assert_eq!(
            app.count(&format!("SELECT count(*) FROM {table}")).await,
            0,
            "{table}"
        );
    }
    // The same address, printable, is placed.
    let body = json!({ "lines": [{ "sku": "MUG", "quantity": 1 }], "shipping": address });
    let placed = app.place(&app.token, "clean", &body).await;
    assert_eq!(placed.status, 202, "{}", placed.body);
}
