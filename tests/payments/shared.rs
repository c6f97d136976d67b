//! A shared PSP account: soldonce touches only the payments it made (its
//! `pay:<order_id>` key, for an order it holds). A point of sale's payment,
//! or one whose reference merely looks like an order id, is listed as
//! foreign and never refunded — by the periodic reconciliation or by hand —
//! while a charge of soldonce's that cannot settle its order still is, once.

use soldonce_tests::eventually;
use soldonce_tests::saga::{assert_audit_clean, psp_listing, Saga, SagaOptions};
use std::time::Duration;

fn soldonce(args: &[&str], saga: &Saga) -> (Option<i32>, String) {
    soldonce_tests::relay::soldonce(
        args,
        &[
            ("DATABASE_URL", &saga.app.database_url),
            ("PSP_URL", &saga.psp_url),
        ],
    )
}

async fn state_of(saga: &Saga, id: &str) -> String {
    let view = saga
        .app
        .get(&saga.app.token, &format!("/v1/orders/{id}"))
        .await;
    view.body["state"].as_str().unwrap_or("").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_soldonce_did_not_make_are_never_refunded() {
    let mut saga = Saga::start_with(SagaOptions {
        ttl: Duration::from_secs(2),
        worker: false,
        reconcile_interval: Duration::from_millis(200),
        ..SagaOptions::default()
    })
    .await;
    let app = saga.app.clone();
    app.add_product("TEE", 2500, 1).await;
    saga.start_expiry(Duration::from_millis(50)).await;
    // Only reconciliation hears of the payments: no webhook arrives.
    saga.set_faults(r#"{"drop_webhook_rate": 1.0}"#).await;
    // soldonce's own charge, landing after its order expired and its unit was sold.
    let late = saga.order("TEE").await;
    eventually("the order to expire", Duration::from_secs(30), || async {
        (state_of(&saga, &late).await == "expired").then_some(())
    })
    .await;
    let holder = saga.order("TEE").await;
    let pos = saga
        .charge_directly("POS-RECEIPT-42", 1990, "BRL", "pos-terminal-7:42")
        .await;
    let stranger = uuid::Uuid::new_v4();
    // Even soldonce's key shape, for an order it does not hold (another shop on the account).
    let lookalike = saga
        .charge_directly(
            &stranger.to_string(),
            4200,
            "BRL",
            &format!("pay:{stranger}"),
        )
        .await;
    let own = saga
        .charge_directly(&late, 2500, "BRL", &format!("pay:{late}"))
        .await;
    let (pos, lookalike, own) = (
        pos["id"].as_str().expect("id").to_owned(),
        lookalike["id"].as_str().expect("id").to_owned(),
        own["id"].as_str().expect("id").to_owned(),
    );
    saga.fault_fired("drop_webhook", 3.0).await;
    saga.start_worker().await;
    eventually("soldonce's own late charge to be refunded", Duration::from_secs(30), || async {
        let refunds = saga.psp_payment(&own).await["refunds"].as_array().map_or(0, Vec::len);
        let recorded = app.count(&format!("SELECT count(*) FROM payments WHERE payment_id = '{own}' AND refund_state = 'succeeded' AND reason = 'units_gone'")).await;
        (refunds == 1 && recorded == 1).then_some(())
    })
    .await;
    let listed = format!(
        "SELECT count(*) FROM foreign_payments WHERE payment_id IN ('{pos}', '{lookalike}')"
    );
    app.wait_count("the periodic run to list both as foreign", &listed, 2)
        .await;
    let (code, text) = soldonce(&["reconcile"], &saga);
    assert_eq!(code, Some(0), "foreign payments leave it clean: {text}");
    assert!(text.contains("2 foreign payments"), "{text}");
    for id in [&pos, &lookalike] {
        assert!(text.contains(&format!("FOREIGN {id}")), "{text}");
    }
    // Two more periodic runs after the one by hand: still nothing touched.
    let run_at = "SELECT (extract(epoch FROM last_run_at) * 1000000)::bigint FROM reconcile_state";
    let after = app.count(run_at).await;
    for _ in 0..2 {
        let before = app.count(run_at).await;
        eventually("a periodic run", Duration::from_secs(30), || async {
            (app.count(run_at).await > before).then_some(())
        })
        .await;
    }
    assert!(app.count(run_at).await > after);
    // Counted at the PSP: one refund in all, of soldonce's own charge.
    let refunds = psp_listing(&app, &saga.psp_url, "refunds").await;
    let refunded: Vec<&str> = refunds
        .iter()
        .filter_map(|r| r["payment_id"].as_str())
        .collect();
    assert_eq!(refunded, [own.as_str()], "{refunds:?}");
    // Counted in soldonce's rows: no payment row for either, both listed foreign.
    let rows =
        format!("SELECT count(*) FROM payments WHERE payment_id IN ('{pos}', '{lookalike}')");
    assert_eq!(app.count(&rows).await, 0);
    assert_eq!(app.count(&listed).await, 2);
    assert_eq!(state_of(&saga, &holder).await, "confirmed");
    assert_eq!(state_of(&saga, &late).await, "refunded");
    let findings = app
        .count("SELECT count(*) FROM reconcile_findings WHERE NOT repaired")
        .await;
    assert_eq!(findings, 0, "foreign payments never make the audit red");
    assert_audit_clean(&app).await;
}
