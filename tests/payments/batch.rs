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
        abandoned: false,
        next_action_url: None,
    }
}

fn answer(l: &Learned) -> String {
    match l {
        Learned::Confirmed { reclaimed, .. } => format!("confirmed(reclaimed={reclaimed})"),
        Learned::RefundDecided(r) => format!("refund({})", r.as_str()),
        Learned::Declined(_) => "declined".into(),
        Learned::AlreadyKnown => "known".into(),
        Learned::Unknown(s) => format!("unknown({s})"),
        Learned::Foreign => "foreign".into(),
        Learned::AwaitingAction => "awaiting_action".into(),
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
            "foreign".into(),
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
    let (foreign, known) = again.split_last().expect("answers");
    assert!(known.iter().all(|a| a == "known"), "{again:?}");
    assert_eq!(foreign, "foreign", "never recorded, so never known");
    assert_eq!(app.count("SELECT count(*) FROM events").await, events);
    assert_eq!(app.count("SELECT count(*) FROM payments").await, 5);
    assert_eq!(app.buckets("MUG").await, expected);
    assert_audit_clean(&app).await;
}

/// A worker's connections live as long as the process, and a statement
/// prepared on one keeps the generic plan PostgreSQL settles on after five
/// calls, made on the statistics of that moment. On a new system (or in a
/// benchmark's first seconds) that moment is an empty payments table, and
/// the plan kept for "which of these payments are already recorded" then
/// read every payment at each call as the table grew. So the batch's two
/// look-ups by key set (the known payments, and fulfillment's orders with
/// their shipments) run in functions that plan their statement at each
/// call on the tables as they are, while the call itself is kept prepared
/// (one round trip). So does the batch's load of its orders (migration 33:
/// its plan kept from the empty table read all 20,000 orders of the grown
/// one to load three). Checked with PostgreSQL's count of the rows a
/// transaction read by scanning the payments, shipments and orders tables:
/// after more than five batches on the empty tables, the store's batch on
/// the grown ones scans none, where the payments' statement prepared on
/// its own scans them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_lookups_by_key_set_are_planned_on_the_tables_as_they_are() {
    const LOOK_UP: &str =
        "SELECT payment_id FROM payments WHERE payment_id = ANY($1) ORDER BY payment_id FOR UPDATE";
    let app = TestApp::spawn().await;
    let pool = store::connect(&app.database_url, 1)
        .await
        .expect("one connection");
    let ids =
        |n: usize, tag: &str| -> Vec<String> { (0..n).map(|i| format!("pay-{tag}-{i}")).collect() };
    // EXECUTE takes no bound parameters: the ids as a literal array.
    let literal = |ids: Vec<String>| {
        let quoted: Vec<String> = ids.iter().map(|i| format!("'{i}'")).collect();
        format!("ARRAY[{}]", quoted.join(", "))
    };
    let mut conn = pool.acquire().await.expect("connection");
    for sql in [
        "ALTER TABLE payments SET (autovacuum_enabled = false)".to_owned(),
        "ALTER TABLE orders SET (autovacuum_enabled = false)".to_owned(),
        "ALTER TABLE shipments SET (autovacuum_enabled = false)".to_owned(),
        "ANALYZE payments, orders, shipments".to_owned(),
        format!("PREPARE known(text[]) AS {LOOK_UP}"),
    ] {
        sqlx::query(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    for _ in 0..6 {
        sqlx::query(&format!("EXECUTE known({})", literal(ids(10, "early"))))
            .execute(&mut *conn)
            .await
            .expect("a look-up on the empty table");
    }
    drop(conn);

    // The store's batches on the empty table, more than five times on the
    // pool's one connection.
    let batch = |tag: String| -> Vec<(PaymentFact, Source, Metadata)> {
        ids(3, &tag)
            .into_iter()
            .map(|p| {
                let f = fact(&p, Some(Uuid::now_v7()), PspStatus::Succeeded, 100);
                let meta = Metadata::spontaneous("test", f.order_id.unwrap_or_default());
                (f, Source::Worker, meta)
            })
            .collect()
    };
    let orders = || -> Vec<(Uuid, Metadata)> {
        (0..3)
            .map(|_| {
                let id = Uuid::now_v7();
                (id, Metadata::spontaneous("test", id))
            })
            .collect()
    };
    let mut scanned_by_batch = Vec::new();
    for round in 0..8 {
        if round == 7 {
            for sql in [
                "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from) \
                 SELECT 'pay-old-' || i, gen_random_uuid(), 100, 'BRL', 'attached', 'worker' FROM generate_series(1, 20000) i",
                "INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000aa', 'grown')",
                "INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at) \
                 SELECT gen_random_uuid(), '00000000-0000-0000-0000-0000000000aa', 'payment_pending', 'BRL', 100, 1, now(), now(), now() \
                 FROM generate_series(1, 20000)",
                "INSERT INTO shipments (id, order_id, state, version, created_at, updated_at) \
                 SELECT gen_random_uuid(), id, 'pending', 1, now(), now() FROM orders",
            ] {
                sqlx::query(sql)
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("the tables grow: {sql}: {e}"));
            }
        }
        let mut tx = soldonce_tests::counted_transaction(&pool).await;
        let learned = store::payments::learn_many(&mut tx, &batch(format!("batch{round}")))
            .await
            .expect("learned");
        assert_eq!(learned.len(), 3);
        let created = store::shipments::create_many(&mut tx, &orders())
            .await
            .expect("shipments");
        assert!(created
            .iter()
            .all(|c| *c == store::shipments::Created::NotConfirmed(None)));
        let mut scanned = Vec::new();
        for table in ["payments", "shipments", "orders"] {
            scanned.push(soldonce_tests::xact_rows_scanned(&mut tx, table).await);
        }
        scanned_by_batch.push(scanned);
        tx.commit().await.expect("commit");
    }
    assert_eq!(
        scanned_by_batch.last(),
        Some(&vec![0, 0, 0]),
        "the batch on the grown tables scans no payment, no shipment and no order (each batch's scans, payments, shipments and orders: {scanned_by_batch:?})"
    );

    // The look-up prepared on its own, planned on the empty table, scans the grown one.
    let mut tx = soldonce_tests::counted_transaction(&pool).await;
    sqlx::query(&format!("EXECUTE known({})", literal(ids(10, "late"))))
        .execute(&mut *tx)
        .await
        .expect("the kept plan");
    let kept = soldonce_tests::xact_rows_scanned(&mut tx, "payments").await;
    tx.rollback().await.expect("rollback");
    assert!(
        kept >= 20_000,
        "the plan kept from the empty table scans the grown one ({kept} rows read): what the functions avoid"
    );

    soldonce_tests::assert_kept_prepared(
        &pool,
        &[
            store::payments::LOCK_KNOWN_SQL,
            store::shipments::LOCK_ORDERS_SQL,
            store::orders::BY_ID_SQL,
        ],
    )
    .await;
}

/// A confirmed order must name a payment attached to it: a constraint
/// trigger checks it at every confirmation, looking the payment up by its
/// key. PL/pgSQL keeps that statement's plan for the connection's life;
/// planned while `payments` was empty, it was a scan, which then read every
/// payment at each confirmation as the table grew. The check now probes
/// the key at every size: after more than five confirmations on an empty,
/// analyzed `payments`, a confirmation on 20,000 payments reads none of
/// them by scanning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_that_a_confirmed_orders_payment_is_attached_probes_it_by_its_key_at_every_size()
{
    let app = TestApp::spawn().await;
    let pool = soldonce_tests::pool_on_frozen_statistics(
        &app.database_url,
        &["payments"],
        &["INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000aa', 'checked')"],
    )
    .await;
    // One order confirmed on its attached payment, the check run before
    // the commit; returns the payment rows the transaction scanned.
    let confirm = |pool: sqlx::PgPool| async move {
        let order = Uuid::now_v7();
        let payment = format!("pay-{order}");
        let mut tx = soldonce_tests::counted_transaction(&pool).await;
        for (sql, what) in [
            (
                "INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at) \
                 VALUES ($1, '00000000-0000-0000-0000-0000000000aa', 'payment_pending', 'BRL', 100, 1, now(), now(), now())",
                "the order",
            ),
            (
                "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from) \
                 VALUES ($2, $1, 100, 'BRL', 'attached', 'worker')",
                "its payment",
            ),
            (
                "UPDATE orders SET state = 'confirmed', payment_id = $2, paid_minor = 100, version = 2 WHERE id = $1",
                "its confirmation",
            ),
        ] {
            sqlx::query(sql)
                .bind(order)
                .bind(&payment)
                .execute(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        sqlx::query("SET CONSTRAINTS orders_confirmed_payment_attached IMMEDIATE")
            .execute(&mut *tx)
            .await
            .expect("the check, now");
        let scanned = soldonce_tests::xact_rows_scanned(&mut tx, "payments").await;
        tx.commit().await.expect("commit");
        scanned
    };
    for _ in 0..7 {
        confirm(pool.clone()).await;
    }
    sqlx::query(
        "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from) \
         SELECT 'pay-old-' || i, gen_random_uuid(), 100, 'BRL', 'attached', 'worker' FROM generate_series(1, 20000) i",
    )
    .execute(&pool)
    .await
    .expect("payments grow");
    let scanned = confirm(pool.clone()).await;
    assert_eq!(
        scanned, 0,
        "the check on more than 20,000 payments reads none of them by scanning"
    );
    // And it still refuses a confirmation on a payment that is not attached.
    let order = Uuid::now_v7();
    let refused = sqlx::query(
        "WITH o AS (INSERT INTO orders (id, account_id, state, currency, total_minor, version, expires_at, created_at, updated_at, payment_id, paid_minor) \
         VALUES ($1, '00000000-0000-0000-0000-0000000000aa', 'confirmed', 'BRL', 100, 1, now(), now(), now(), 'pay-old-1', 100) RETURNING 1) \
         SELECT count(*) FROM o",
    )
    .bind(order)
    .execute(&pool)
    .await
    .expect_err("a confirmation on another order's payment is refused at commit");
    assert!(refused.to_string().contains("not attached"), "{refused}");
}
