//! The store's set-based payment path: one batch of PSP facts, several of
//! them about the same order, decided each against the order as the facts
//! before it left it, and written in one transaction; the same batch again
//! (a redelivery) changes nothing.

use domain::{PspStatus, RefundReason};
use events::Metadata;
use soldonce_tests::app::Buckets;
use soldonce_tests::saga::assert_audit_clean;
use soldonce_tests::TestApp;
use store::payments::{Learned, PaymentFact, Source};
use uuid::Uuid;

fn fact(payment: &str, order: Option<Uuid>, status: PspStatus, amount: i64) -> PaymentFact {
    let failed = status == PspStatus::Failed;
    PaymentFact {
        payment_id: payment.into(),
        order_id: order,
        status,
        amount_minor: amount,
        currency: "BRL".into(),
        failure_reason: failed.then(|| "card_declined".into()),
    }
}

fn answer(l: &Learned) -> String {
    match l {
        Learned::Confirmed { reclaimed, .. } => format!("confirmed(reclaimed={reclaimed})"),
        Learned::RefundDecided(r) => format!("refund({})", r.as_str()),
        Learned::Declined(_) => "declined".into(),
        Learned::AlreadyKnown => "known".into(),
        Learned::Unknown(s) => format!("unknown({s})"),
    }
}

#[tokio::test]
async fn one_batch_of_facts_about_the_same_orders_decides_each_once_and_a_redelivery_changes_nothing(
) {
    let app = TestApp::spawn().await;
    app.add_product("MUG", 2500, 3).await;
    let mut orders = vec![];
    for _ in 0..3 {
        let reply = app.buy("MUG", 1).await;
        assert_eq!(reply.status, 202, "{}", reply.body);
        orders.push(
            reply.body["id"]
                .as_str()
                .expect("id")
                .parse::<Uuid>()
                .expect("uuid"),
        );
    }
    let (a, b, c) = (orders[0], orders[1], orders[2]);
    let nowhere = Uuid::now_v7();
    let ok = || PspStatus::Succeeded;
    let batch: Vec<(PaymentFact, Source, Metadata)> = [
        fact("pay-a1", Some(a), ok(), 2500),
        fact("pay-a1", Some(a), ok(), 2500),
        fact("pay-a2", Some(a), ok(), 2500),
        fact("pay-b1", Some(b), PspStatus::Failed, 2500),
        fact("pay-b2", Some(b), ok(), 2500),
        fact("pay-c1", Some(c), ok(), 2400),
        fact("pay-c2", Some(c), ok(), 2500),
        fact("pay-x", Some(nowhere), ok(), 2500),
    ]
    .into_iter()
    .map(|f| {
        let meta = Metadata::spontaneous("test", f.order_id.unwrap_or_default());
        (f, Source::Worker, meta)
    })
    .collect();
    let learn = |batch: Vec<(PaymentFact, Source, Metadata)>| {
        let pool = app.pool.clone();
        async move {
            let mut tx = pool.begin().await.expect("tx");
            let learned = store::payments::learn_many(&mut tx, &batch)
                .await
                .expect("the batch is learned");
            tx.commit().await.expect("commit");
            learned.iter().map(answer).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        learn(batch.clone()).await,
        [
            "confirmed(reclaimed=false)".to_owned(),
            "known".into(),
            format!("refund({})", RefundReason::SecondPayment.as_str()),
            "declined".into(),
            format!("refund({})", RefundReason::AfterDecline.as_str()),
            format!("refund({})", RefundReason::AmountMismatch.as_str()),
            "confirmed(reclaimed=false)".into(),
            format!("refund({})", RefundReason::NoSuchOrder.as_str()),
        ]
    );
    // Counted again from the rows: one payment row each, the right disposition.
    let rows: Vec<(String, Option<Uuid>, String, Option<String>)> = sqlx::query_as(
        "SELECT payment_id, order_id, disposition, reason FROM payments ORDER BY payment_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("payments");
    let refund = |r: RefundReason| ("refund".to_owned(), Some(r.as_str().to_owned()));
    let rows: Vec<(String, (String, Option<String>))> =
        rows.into_iter().map(|(p, _, d, r)| (p, (d, r))).collect();
    assert_eq!(
        rows,
        [
            ("pay-a1".to_owned(), ("attached".to_owned(), None)),
            ("pay-a2".into(), refund(RefundReason::SecondPayment)),
            ("pay-b2".into(), refund(RefundReason::AfterDecline)),
            ("pay-c1".into(), refund(RefundReason::AmountMismatch)),
            ("pay-c2".into(), ("attached".into(), None)),
            ("pay-x".into(), refund(RefundReason::NoSuchOrder)),
        ]
    );
    let states: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, state FROM orders WHERE id = ANY($1)")
            .bind(&orders)
            .fetch_all(&app.pool)
            .await
            .expect("states");
    let state = |id: Uuid| {
        states
            .iter()
            .find(|(o, _)| *o == id)
            .map(|(_, s)| s.as_str())
    };
    assert_eq!(
        (state(a), state(b), state(c)),
        (Some("confirmed"), Some("payment_failed"), Some("confirmed"))
    );
    let expected = Buckets {
        available: 1,
        reserved: 0,
        sold: 2,
    };
    assert_eq!(app.buckets("MUG").await, expected);
    assert_eq!(app.ledger("MUG").await, expected, "the ledger agrees");
    let events = app.count("SELECT count(*) FROM events").await;

    // The same batch again, as after a crash before the acks: nothing new.
    let again = learn(batch).await;
    assert!(again.iter().all(|a| a == "known"), "{again:?}");
    assert_eq!(app.count("SELECT count(*) FROM events").await, events);
    assert_eq!(app.count("SELECT count(*) FROM payments").await, 6);
    assert_eq!(app.buckets("MUG").await, expected);
    assert_audit_clean(&app).await;
}
