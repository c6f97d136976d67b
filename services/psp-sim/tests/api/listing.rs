//! Paged listings by creation time, for reconciliation: `GET /v1/payments` and
//! `GET /v1/refunds` with `created_gte`, `limit` and `cursor`.

use chrono::{FixedOffset, SecondsFormat};
use psp_sim::model::{Payment, Refund};
use serde_json::{json, Value};

use crate::support::{payment_body, problem, Listing, TestApp};

async fn paid(app: &TestApp, key: &str) -> Payment {
    let response = app
        .pay(key, &payment_body(1000, &format!("ord_{key}")))
        .await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

fn ids<T>(pages: &[Listing<T>], id: impl Fn(&T) -> &str) -> Vec<String> {
    pages
        .iter()
        .flat_map(|page| page.data.iter().map(&id))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn paging_250_payments_by_100_gives_three_pages_with_each_payment_once_in_order() {
    let app = TestApp::spawn().await;
    let mut created = Vec::new();
    for i in 0..250 {
        created.push(paid(&app, &format!("k{i}")).await.id);
    }

    let pages = app.list_all::<Payment>("/v1/payments", 100).await;

    let sizes: Vec<usize> = pages.iter().map(|page| page.data.len()).collect();
    assert_eq!(sizes, [100, 100, 50]);
    let more: Vec<bool> = pages.iter().map(|page| page.has_more).collect();
    assert_eq!(more, [true, true, false]);
    assert_eq!(ids(&pages, |p: &Payment| &p.id), created);
    let listed: Vec<&Payment> = pages.iter().flat_map(|page| &page.data).collect();
    assert!(listed
        .windows(2)
        .all(|pair| (pair[0].created_at, &pair[0].id) < (pair[1].created_at, &pair[1].id)));
}

#[tokio::test]
async fn payments_created_while_a_client_pages_are_each_listed_once() {
    let app = TestApp::spawn().await;
    let mut created = Vec::new();
    for i in 0..10 {
        created.push(paid(&app, &format!("before{i}")).await.id);
    }
    let creator = tokio::spawn({
        let app = TestApp {
            addr: app.addr,
            client: reqwest::Client::new(),
        };
        async move {
            let mut ids = Vec::new();
            for i in 0..60 {
                ids.push(paid(&app, &format!("during{i}")).await.id);
            }
            ids
        }
    });

    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        // Finished before this page is read, so everything it made is visible to the read.
        let finished = creator.is_finished();
        let mut query = vec![("limit", "7")];
        if let Some(cursor) = cursor.as_deref() {
            query.push(("cursor", cursor));
        }
        let page: Listing<Payment> = app.list("/v1/payments", &query).await;
        listed.extend(page.data.into_iter().map(|p| p.id));
        cursor = page.next_cursor.or(cursor);
        if finished && !page.has_more {
            break;
        }
    }

    created.extend(creator.await.unwrap());
    assert_eq!(listed, created);
}

#[tokio::test]
async fn the_last_cursor_resumes_with_what_is_created_later() {
    let app = TestApp::spawn().await;
    let first = paid(&app, "early").await;
    let page: Listing<Payment> = app.list("/v1/payments", &[]).await;
    assert!(!page.has_more);
    let cursor = page.next_cursor.expect("a cursor after the last payment");

    let empty: Listing<Payment> = app.list("/v1/payments", &[("cursor", &cursor)]).await;
    assert!(empty.data.is_empty() && !empty.has_more);
    assert_eq!(empty.next_cursor.as_deref(), Some(cursor.as_str()));
    let later = paid(&app, "late").await;
    let resumed: Listing<Payment> = app.list("/v1/payments", &[("cursor", &cursor)]).await;

    assert_eq!(resumed.data, [later]);
    assert_ne!(resumed.data[0].id, first.id);
}

#[tokio::test]
async fn created_gte_lists_only_what_was_created_at_or_after_it() {
    let app = TestApp::spawn().await;
    paid(&app, "a").await;
    let b = paid(&app, "b").await;
    let c = paid(&app, "c").await;

    let since = b.created_at.to_rfc3339_opts(SecondsFormat::Nanos, true);
    let page: Listing<Payment> = app.list("/v1/payments", &[("created_gte", &since)]).await;
    assert_eq!(page.data, [b.clone(), c.clone()]);
    // The same instant with an offset (the client percent-encodes its `+`).
    let east = b
        .created_at
        .with_timezone(&FixedOffset::east_opt(3600).unwrap());
    let since = east.to_rfc3339_opts(SecondsFormat::Nanos, false);
    let page: Listing<Payment> = app.list("/v1/payments", &[("created_gte", &since)]).await;
    assert_eq!(page.data, [b, c]);

    let tomorrow = (chrono::Utc::now() + chrono::TimeDelta::days(1)).to_rfc3339();
    let empty: Value = app
        .client
        .get(app.url("/v1/payments"))
        .query(&[("created_gte", tomorrow)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        empty,
        json!({ "data": [], "has_more": false, "next_cursor": null })
    );
}

#[tokio::test]
async fn refunds_are_listed_by_creation_time_and_payments_carry_theirs() {
    let app = TestApp::spawn().await;
    let a = paid(&app, "ra").await;
    let b = paid(&app, "rb").await;
    let mut refunds = Vec::new();
    for (payment, key) in [(&a, "r1"), (&b, "r2"), (&a, "r3")] {
        let response = app
            .refund(&payment.id, key, Some(json!({ "amount_minor": 100 })))
            .await;
        assert_eq!(response.status(), 201);
        refunds.push(response.json::<Refund>().await.unwrap());
    }

    let pages = app.list_all::<Refund>("/v1/refunds", 2).await;

    assert_eq!(pages.len(), 2);
    let listed: Vec<Refund> = pages.into_iter().flat_map(|page| page.data).collect();
    assert_eq!(listed, refunds);
    let payments: Listing<Payment> = app.list("/v1/payments", &[]).await;
    assert_eq!(
        payments.data[0].refunds,
        [refunds[0].clone(), refunds[2].clone()]
    );
    assert_eq!(payments.data[1].refunds, [refunds[1].clone()]);
}

#[tokio::test]
async fn bad_listing_parameters_are_400_problems_naming_them() {
    let app = TestApp::spawn().await;
    paid(&app, "x").await;
    let refund_page: Listing<Refund> = app.list("/v1/refunds", &[]).await;
    assert_eq!(refund_page.next_cursor, None);
    let payment_page: Listing<Payment> = app.list("/v1/payments", &[]).await;
    let payment_cursor = payment_page.next_cursor.unwrap();
    let cases = [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=many", "limit"),
        ("created_gte=yesterday", "created_gte"),
        ("cursor=not-a-cursor", "cursor"),
        ("page=2", "page"),
    ];
    for path in ["/v1/payments", "/v1/refunds"] {
        for (query, named) in cases {
            let response = app
                .client
                .get(app.url(&format!("{path}?{query}")))
                .send()
                .await
                .unwrap();
            let problem = problem(response, 400).await;
            assert_eq!(problem.problem_type, "urn:psp-sim:problem:invalid-query");
            assert!(
                problem.detail.contains(named),
                "{path}?{query}: {}",
                problem.detail
            );
        }
    }
    // A payments cursor means nothing to the refunds listing.
    let response = app
        .client
        .get(app.url("/v1/refunds"))
        .query(&[("cursor", &payment_cursor)])
        .send()
        .await
        .unwrap();
    assert!(problem(response, 400).await.detail.starts_with("cursor: "));
}
