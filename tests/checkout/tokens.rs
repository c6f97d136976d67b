//! Made-up tokens cannot starve real buyers: checkout holds every issued
//! token's digest prefix in memory and refuses the rest without a lookup,
//! and a token issued a moment ago is found on its first request, by every
//! checkout.

use soldonce_tests::{eventually, TestApp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const NO_ORDER: &str = "/v1/orders/00000000-0000-0000-0000-000000000000";

/// Held by each test here: they alone send made-up tokens of the issued
/// shape, whose outcomes the flood counts in the process-wide registry.
static MADE_UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A token of the issued shape that nobody issued.
fn made_up() -> String {
    format!("so_{}", Uuid::new_v4().simple().to_string().repeat(2))
}

fn one_mug() -> serde_json::Value {
    serde_json::json!({ "lines": [{ "sku": "MUG", "quantity": 1 }] })
}

/// The token checks of `outcome` counted so far (the registry is this test
/// process's: compare deltas).
async fn lookups(app: &TestApp, outcome: &str) -> f64 {
    let key = format!("soldonce_token_lookups_total{{outcome=\"{outcome}\"}}");
    soldonce_tests::metric_sample(&app.metrics().await, &key).unwrap_or(0.0)
}

/// The set's reads of issued tokens so far.
async fn set_reads(app: &TestApp) -> f64 {
    let text = app.metrics().await;
    soldonce_tests::metric_sample(&text, "soldonce_token_set_reads_total{outcome=\"ok\"}")
        .unwrap_or(0.0)
}

/// Waits until `app` has read the issued tokens: a made-up token is
/// refused from memory (before, it is looked up within the budget).
async fn wait_for_the_set(app: &TestApp) {
    let before = lookups(app, "not_issued").await;
    eventually(
        "the issued tokens read",
        Duration::from_secs(10),
        || async move {
            app.get(&made_up(), NO_ORDER).await.assert_problem(401);
            (lookups(app, "not_issued").await > before).then_some(())
        },
    )
    .await;
}

/// What a flood sent and how checkout answered.
struct Flood {
    seconds: f64,
    refused: usize,
    other: Vec<u16>,
}

/// Sends made-up tokens at `rate` a second (at most 512 at once) until
/// `stop`, counting answers in `answered`; a request that fails to get an
/// answer counts as status 0.
async fn flood(
    app: Arc<TestApp>,
    rate: f64,
    answered: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Flood {
    let gate = Arc::new(tokio::sync::Semaphore::new(512));
    let mut requests = tokio::task::JoinSet::new();
    let mut statuses = Vec::new();
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            let permit = gate.clone().acquire_owned().await.expect("gate");
            let request = app.client.get(app.url(NO_ORDER)).bearer_auth(made_up());
            let answered = answered.clone();
            requests.spawn(async move {
                let status = request.send().await.map_or(0, |r| r.status().as_u16());
                answered.fetch_add(1, Ordering::Relaxed);
                drop(permit);
                status
            });
            sent += 1;
        }
        while let Some(done) = requests.try_join_next() {
            statuses.push(done.expect("flood request"));
        }
    }
    while let Some(done) = requests.join_next().await {
        statuses.push(done.expect("flood request"));
    }
    let seconds = started.elapsed().as_secs_f64();
    let refused = statuses.iter().filter(|s| **s == 401).count();
    statuses.retain(|s| *s != 401);
    Flood {
        seconds,
        refused,
        other: statuses,
    }
}

/// The acceptance of issue 38: a buyer whose token is issued during a flood
/// of made-up tokens (sent at 3,000 a second) gets `202` on its first
/// request and on at least 19 of 20, the flood answered all along. No
/// made-up token is looked up, in the database or within
/// `TOKEN_LOOKUP_RATE` (50 here, the budget the buyer once shared with the
/// flood); the flood costs only the set's reads of new tokens. The rate the
/// flood reached is printed, not asserted: it is a speed figure, and this
/// debug build on a shared machine has answered anywhere from about 1,000
/// to over 2,000 a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_first_seen_during_a_token_flood_gets_202_at_once() {
    let _alone = MADE_UP.lock().await;
    let limits = checkout::Limits {
        token_lookup_rate: 50,
        ..checkout::Limits::unlimited()
    };
    let app = Arc::new(TestApp::spawn_with_limits(limits).await);
    app.add_product("MUG", 100, 1_000).await;
    wait_for_the_set(&app).await;
    let (looked_up, limited, refused, reads) = (
        lookups(&app, "unknown").await,
        lookups(&app, "limited").await,
        lookups(&app, "not_issued").await,
        set_reads(&app).await,
    );
    let (answered, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let attack = tokio::spawn(flood(app.clone(), 3_000.0, answered.clone(), stop.clone()));
    let answered_at_least = |n: u64| {
        let answered = answered.clone();
        move || {
            let done = answered.load(Ordering::Relaxed) >= n;
            async move { done.then_some(()) }
        }
    };
    eventually(
        "the flood to be under way",
        Duration::from_secs(20),
        answered_at_least(2_000),
    )
    .await;

    // The buyer's token is issued now: no checkout has seen it.
    let (buyer, token) = app.new_account("a buyer during the flood").await;
    let flooded_before = answered.load(Ordering::Relaxed);
    let mut answers = vec![];
    for _ in 0..20 {
        let placed = app
            .place(&token, &Uuid::new_v4().to_string(), &one_mug())
            .await;
        answers.push(placed.status);
    }
    let flooded_during = answered.load(Ordering::Relaxed) - flooded_before;
    // At least 6,000 made-up tokens in all, the buyer's orders among them.
    eventually(
        "6,000 made-up tokens answered",
        Duration::from_secs(30),
        answered_at_least(6_000),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let flood = attack.await.expect("flood");

    let rate = flood.refused as f64 / flood.seconds;
    let placed = answers.iter().filter(|s| **s == 202).count();
    let rows = app
        .count(&format!(
            "SELECT count(*) FROM orders WHERE account_id = '{buyer}'"
        ))
        .await;
    let (looked_up, limited, refused, reads) = (
        lookups(&app, "unknown").await - looked_up,
        lookups(&app, "limited").await - limited,
        lookups(&app, "not_issued").await - refused,
        set_reads(&app).await - reads,
    );
    eprintln!(
        "token flood: {} made-up tokens in {:.1} s ({rate:.0}/s), all 401; buyer: {placed}/20 \
         202 (first {}), {rows} orders; made-up tokens looked up: {looked_up} in the database, \
         {limited} within the budget; {reads} reads of new tokens",
        flood.refused, flood.seconds, answers[0]
    );
    assert_eq!(answers[0], 202, "the buyer's first request: {answers:?}");
    assert!(placed >= 19, "{answers:?}");
    assert_eq!(rows, placed as i64, "one order for each 202");
    let mut other = flood.other.clone();
    other.sort_unstable();
    other.dedup();
    assert!(
        flood.other.is_empty(),
        "every made-up token is 401, not {} times {other:?}",
        flood.other.len()
    );
    assert!(
        flooded_during > 0,
        "the flood went on while the buyer placed its orders ({rate:.0} made-up tokens a second)"
    );
    assert_eq!(
        looked_up, 0.0,
        "no made-up token was looked up in the database"
    );
    assert_eq!(limited, 0.0, "none took the lookup budget");
    assert!(
        refused >= flood.refused as f64,
        "{refused} refused from memory"
    );
    // At most one read every 50 ms, however large the flood: here under one
    // statement for 50 made-up tokens, other tests' reads included.
    assert!(
        reads * 50.0 <= flood.refused as f64,
        "{reads} reads for {} made-up tokens",
        flood.refused
    );
}

/// A token whose transaction began before a later token's and committed
/// after a checkout's read had seen that later one is still found, by both
/// checkouts, on its first request: reads take up from the oldest
/// transaction the last one could not see, not past the newest token it saw.
#[tokio::test]
async fn a_token_committed_after_a_read_is_found_by_every_checkout_at_once() {
    let _alone = MADE_UP.lock().await;
    let first = TestApp::spawn().await;
    let second = TestApp::spawn_on(first.database_url.clone(), Duration::from_secs(900)).await;
    for app in [&first, &second] {
        wait_for_the_set(app).await;
    }
    let token = made_up();
    let mut issuing = first.pool.begin().await.expect("begin");
    let account = Uuid::now_v7();
    sqlx::query("INSERT INTO accounts (id, name) VALUES ($1, 'late')")
        .bind(account)
        .execute(&mut *issuing)
        .await
        .expect("account");
    sqlx::query("INSERT INTO api_tokens (token_sha256, account_id) VALUES ($1, $2)")
        .bind(store::accounts::digest(&token).as_slice())
        .bind(account)
        .execute(&mut *issuing)
        .await
        .expect("token");
    // A later token commits first, and each checkout reads it (for its
    // first request) while the earlier one's transaction is still open.
    let (_, later) = first.new_account("issued later, committed first").await;
    for app in [&first, &second] {
        let listed = app.get(&later, "/v1/orders?limit=1").await;
        assert_eq!(listed.status, 200, "{}", listed.body);
    }
    issuing.commit().await.expect("commit");
    for app in [&first, &second] {
        let listed = app.get(&token, "/v1/orders?limit=1").await;
        assert_eq!(listed.status, 200, "{}", listed.body);
    }
}
