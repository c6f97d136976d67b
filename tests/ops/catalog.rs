//! `soldonce product`: taking a product off sale and back, and changing
//! its price, as every running checkout sees it — and what bad input does.

use soldonce_tests::relay::soldonce;
use soldonce_tests::saga::pay_by_webhook;
use soldonce_tests::TestApp;
use std::time::Duration;

/// `soldonce --json product …` against the app's database: exit 0 and the JSON.
fn product(app: &TestApp, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json", "product"];
    all.extend(args);
    let (code, said) = soldonce(&all, &[("DATABASE_URL", app.database_url.as_str())]);
    assert_eq!(code, Some(0), "{args:?}: {said}");
    serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {said}"))
}

/// The unit prices of MUG's order lines, by order, from the rows.
async fn unit_prices(app: &TestApp) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT o.id::text, l.unit_price_minor FROM order_lines l JOIN orders o ON o.id = l.order_id \
         WHERE l.sku = 'MUG' ORDER BY o.created_at",
    )
    .fetch_all(&app.pool)
    .await
    .expect("lines")
}

/// A product off sale is refused by every checkout as soon as the command
/// returns (checkout reads the catalogue for every placement, without a
/// cache); an order placed before goes on to be paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deactivated_sku_is_refused_by_every_checkout_and_a_new_price_holds_for_new_orders() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(app.database_url.clone(), Duration::from_secs(900)).await;
    app.add_product("MUG", 100, 10).await;
    let before = app.buy("MUG", 1).await;
    assert_eq!(before.status, 202, "{}", before.body);
    let pending = before.body["id"].as_str().expect("id").to_owned();
    assert_eq!(other.buy("MUG", 1).await.status, 202);

    let off = product(&app, &["deactivate", "--sku", "MUG"]);
    assert_eq!(
        (&off["changed"], &off["product"]["active"]),
        (&true.into(), &false.into())
    );
    for checkout in [&app, &other] {
        let refused = checkout.buy("MUG", 1).await;
        refused.assert_problem(422);
        assert_eq!(
            refused.body["type"],
            "urn:soldonce:problem:product-inactive"
        );
        assert_eq!(refused.body["sku"], "MUG");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        2,
        "nothing placed off sale"
    );
    assert_eq!(
        app.buckets("MUG").await.reserved,
        2,
        "nothing reserved off sale"
    );
    // The order placed before goes on.
    assert_eq!(pay_by_webhook(&app, &pending, 100).await, 200);
    let paid = app.get(&app.token, &format!("/v1/orders/{pending}")).await;
    assert_eq!(paid.body["state"], "confirmed", "{}", paid.body);
    let again = product(&app, &["deactivate", "--sku", "MUG"]);
    assert_eq!(
        again["changed"], false,
        "deactivating twice changes nothing"
    );

    let on = product(&app, &["activate", "--sku", "MUG"]);
    assert_eq!(on["product"]["active"], true);
    assert_eq!(other.buy("MUG", 1).await.status, 202);

    // A new price for new orders; the orders placed keep theirs.
    let updated = product(
        &app,
        &[
            "update",
            "--sku",
            "MUG",
            "--price-minor",
            "250",
            "--name",
            "Big mug",
        ],
    );
    assert_eq!(
        (&updated["price_minor"], &updated["name"]),
        (&250.into(), &"Big mug".into())
    );
    let dearer = app.buy("MUG", 2).await;
    assert_eq!(dearer.status, 202, "{}", dearer.body);
    assert_eq!(dearer.body["total_minor"], 500);
    let prices: Vec<i64> = unit_prices(&app)
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(prices, [100, 100, 100, 250], "counted in the rows");
    let kept = app.get(&app.token, &format!("/v1/orders/{pending}")).await;
    assert_eq!(kept.body["total_minor"], 100, "{}", kept.body);
    // A currency changes only with its price.
    let dollars = product(
        &app,
        &[
            "update",
            "--sku",
            "MUG",
            "--price-minor",
            "300",
            "--currency",
            "USD",
        ],
    );
    assert_eq!(dollars["currency"], "USD");
    let in_dollars = app.buy("MUG", 1).await;
    assert_eq!(
        (
            &in_dollars.body["currency"],
            &in_dollars.body["total_minor"]
        ),
        (&"USD".into(), &300.into())
    );
    let kept = app.get(&app.token, &format!("/v1/orders/{pending}")).await;
    assert_eq!(
        (&kept.body["currency"], &kept.body["total_minor"]),
        (&"BRL".into(), &100.into())
    );

    // Bad input: one line, exit 2, nothing changed.
    let env = [("DATABASE_URL", app.database_url.as_str())];
    for args in [
        vec!["product", "deactivate", "--sku", "NOPE"],
        vec!["product", "activate", "--sku", "not a sku"],
        vec!["product", "update", "--sku", "NOPE", "--price-minor", "1"],
        vec!["product", "update", "--sku", "MUG"],
        vec!["product", "update", "--sku", "MUG", "--name", "  "],
        vec!["product", "update", "--sku", "MUG", "--price-minor", "-5"],
        vec!["product", "update", "--sku", "MUG", "--currency", "EUR"],
        vec![
            "product",
            "update",
            "--sku",
            "MUG",
            "--price-minor",
            "5",
            "--currency",
            "euro",
        ],
    ] {
        let (code, said) = soldonce(&args, &env);
        assert_eq!(
            (code, said.trim().lines().count()),
            (Some(2), 1),
            "{args:?}: {said}"
        );
    }
    let shown = product(&app, &["show", "--sku", "MUG"]);
    assert_eq!(
        shown,
        serde_json::json!([{ "sku": "MUG", "name": "Big mug", "price_minor": 300, "currency": "USD",
                             "active": true, "max_per_order": null, "per_account_limit": null }])
    );
}
