//! "1 per customer" holds on every path: a late payment that would revive
//! an expired order past its buyer's per-account limit is refunded
//! (`over_limit`), never confirmed — counted in HTTP views, rows and
//! psp-sim's books.

use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, Saga, SagaOptions};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

async fn wait_state(saga: &Saga, id: &str, want: &str) {
    let path = format!("/v1/orders/{id}");
    eventually(&format!("order {id} to be {want}"), SETTLE, || async {
        let r = saga.app.get(&saga.app.token, &path).await;
        (r.body["state"] == want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_payment_never_gives_an_account_more_than_its_per_account_limit() {
    let mut saga = Saga::start_with(SagaOptions {
        ttl: Duration::from_secs(2),
        worker: false,
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("LTD", 2500, 5).await;
    let sku = domain::Sku::parse("LTD").expect("sku");
    assert!(store::catalog::set_limits(&app.pool, &sku, None, Some(1))
        .await
        .expect("limits"));
    saga.start_expiry(Duration::from_millis(50)).await;

    // The buyer's first order expires while its payment is still on its way…
    let first = saga.order("LTD").await;
    wait_state(&saga, &first, "expired").await;
    // …so the buyer orders again (the expired order holds nothing) and pays.
    let second = saga.order("LTD").await;
    saga.charge_directly(&second, 2500, "BRL", &format!("pay:{second}"))
        .await;
    wait_state(&saga, &second, "confirmed").await;
    // Then the first payment lands: reviving its order would make 2 of a limit of 1.
    let late = saga
        .charge_directly(&first, 2500, "BRL", &format!("pay:{first}"))
        .await;
    let payment_id = late["id"].as_str().expect("id").to_owned();
    let decided = format!(
        "SELECT count(*) FROM payments WHERE payment_id = '{payment_id}' AND disposition = 'refund' AND reason = 'over_limit'"
    );
    app.wait_count("the refund decided, over the limit", &decided, 1)
        .await;
    saga.start_worker().await;
    wait_state(&saga, &first, "refunded").await;

    let held = app
        .count(
            "SELECT coalesce(sum(l.quantity), 0)::bigint FROM orders o JOIN order_lines l ON l.order_id = o.id \
             WHERE l.sku = 'LTD' AND o.state = 'confirmed'",
        )
        .await;
    assert_eq!(held, 1, "the account holds exactly its limit");
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM events WHERE stream_id = '{first}' AND type = 'order.confirmed.v1'"
        ))
        .await,
        0,
        "the expired order was never confirmed"
    );
    let psp = saga.psp_payment(&payment_id).await;
    assert_eq!(
        psp["refunds"].as_array().map(Vec::len),
        Some(1),
        "refunded exactly once at the PSP: {psp}"
    );
    let view = app.get(&app.token, &format!("/v1/orders/{first}")).await;
    assert_eq!(
        view.body["refunds"][0]["reason"], "over_limit",
        "{}",
        view.body
    );
    assert_eq!(app.buckets("LTD").await.sold, 1, "one unit sold");
    assert_audit_clean(&app).await;
}
