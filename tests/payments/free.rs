//! Free products: confirmed and shipped without a PSP call; a mixed order
//! charges only its paid total.

use soldonce_tests::app::Buckets;
use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, psp_listing, Saga};
use std::time::Duration;

/// The order of every payment in the PSP's books.
async fn references(saga: &Saga) -> Vec<String> {
    psp_listing(&saga.app, &saga.psp_url, "payments")
        .await
        .iter()
        .map(|p| p["reference"].as_str().expect("reference").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_product_ships_without_a_psp_call_and_a_mixed_order_charges_the_paid_total() {
    let mut saga = Saga::start("{}", Duration::from_secs(2)).await;
    saga.start_fulfillment(Duration::from_millis(20)).await;
    let app = saga.app.clone();
    app.add_product("STICKER", 0, 10).await;
    app.add_product("MUG", 2500, 10).await;
    let free = saga.order("STICKER").await;
    let body = serde_json::json!({ "lines": [{ "sku": "STICKER", "quantity": 2 }, { "sku": "MUG", "quantity": 1 }] });
    let mixed = app.place(&app.token, "mixed-1", &body).await;
    assert_eq!(mixed.status, 202, "{}", mixed.body);
    assert_eq!(mixed.body["total_minor"], 2500);
    let mixed = mixed.body["id"].as_str().expect("id").to_owned();
    for id in [&free, &mixed] {
        eventually(
            &format!("order {id} to be delivered"),
            Duration::from_secs(30),
            || async {
                let view = app.get(&app.token, &format!("/v1/orders/{id}")).await.body;
                (view["state"] == "confirmed" && view["shipment"]["state"] == "delivered")
                    .then_some(())
            },
        )
        .await;
    }
    // The same look-up finds the mixed order's charge: it does see the worker's calls.
    let charged = saga.psp_payments(&mixed).await;
    assert_eq!(charged.len(), 1);
    assert_eq!(charged[0]["amount_minor"], 2500, "the paid total only");
    assert!(
        saga.psp_payments(&free).await.is_empty(),
        "no PSP call for a free order"
    );
    assert_eq!(
        references(&saga).await,
        std::slice::from_ref(&mixed),
        "the PSP's whole books: the mixed order's charge alone"
    );
    let confirmed = app.count(&format!("SELECT count(*) FROM events WHERE stream_id = '{free}'::uuid AND type = 'order.confirmed.v1' AND data->>'payment_id' = 'free:{free}' AND (data->>'amount_minor')::bigint = 0")).await;
    assert_eq!(confirmed, 1, "the event says it was free");
    assert_eq!(
        app.buckets("STICKER").await,
        Buckets {
            available: 7,
            reserved: 0,
            sold: 3
        }
    );
    assert_audit_clean(&app).await;
}

/// The payment worker settles a free order without a PSP; if the buyer
/// cancelled first there is no money to give back, so no refund of
/// `free:<id>` is decided (it could only end refused, the audit red for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_order_cancelled_before_the_worker_saw_it_gets_no_refund() {
    let mut saga = soldonce_tests::saga::Saga::start_with(soldonce_tests::saga::SagaOptions {
        worker: false,
        ..soldonce_tests::saga::SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("STICKER", 0, 10).await;
    app.add_product("MUG", 2500, 10).await;
    let free = saga.order("STICKER").await;
    // Paid, beside it: the worker's calls do reach this PSP, and show in its books.
    let paid = saga.order("MUG").await;
    let cancel = app
        .post_empty(&app.token, &format!("/v1/orders/{free}/cancel"))
        .await;
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    saga.start_worker().await;
    saga.wait_worker_idle(Duration::from_secs(30)).await;
    let view = app
        .get(&app.token, &format!("/v1/orders/{free}"))
        .await
        .body;
    assert_eq!(view["state"], "cancelled");
    assert_eq!(view["refunds"].as_array().map(Vec::len), Some(0), "{view}");
    // Counted in soldonce's rows (no payment, no refund decided) and at the PSP (no call).
    let payments = format!("SELECT count(*) FROM payments WHERE order_id = '{free}'::uuid");
    assert_eq!(app.count(&payments).await, 0);
    let decided = format!("SELECT count(*) FROM events WHERE stream_id = '{free}'::uuid AND type LIKE 'order.refund%'");
    assert_eq!(app.count(&decided).await, 0);
    assert!(saga.psp_payments(&free).await.is_empty());
    assert_eq!(
        saga.settled_state(&paid, Duration::from_secs(30)).await,
        "confirmed"
    );
    assert_eq!(
        saga.psp_payments(&paid).await.len(),
        1,
        "the paid order's charge"
    );
    assert_eq!(
        references(&saga).await,
        [paid],
        "the PSP's whole books: the paid order's charge alone"
    );
    assert_eq!(
        app.buckets("STICKER").await,
        Buckets {
            available: 10,
            reserved: 0,
            sold: 0
        }
    );
    assert_audit_clean(&app).await;
}
