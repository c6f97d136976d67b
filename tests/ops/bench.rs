//! `soldonce bench …` run as an operator runs it. `flash-sale` against the
//! test server: every strategy that must not oversell sells the one unit
//! once in every sellout run, by its answers and by the database; every
//! strategy takes orders under load; the reports are written; the bench's
//! own database is gone afterwards. `saga` and `compare` on the servers and
//! services they start themselves from the debug binaries: every accepted
//! order is confirmed, counted from the load's answers, the orders' states
//! and their events; both sides of a comparison are measured and compared;
//! a bin dir missing a service is refused before anything starts. The
//! scripts' pgbench floor runs on today's schema, and their money seed
//! writes books the audit finds clean.

use serde_json::Value;
use soldonce_tests::relay::binary;
use soldonce_tests::servers;
use sqlx::{Connection, PgConnection};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const STRATEGIES: [&str; 5] = [
    "naive",
    "for-update",
    "conditional",
    "checkout",
    "coalesced",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flash_sale_bench_sells_the_unit_once_with_every_safe_strategy_and_drops_its_database()
{
    let server = servers::shared().postgres.url("postgres");
    let out = tempfile::tempdir().expect("tempdir");
    let bench = tokio::process::Command::new(binary("soldonce"))
        .args(["--json", "bench", "flash-sale"])
        .args(["--runs", "2", "--seconds", "1", "--connections", "50"])
        .args(["--skus", "100", "--out"])
        .arg(out.path())
        .env("DATABASE_URL", &server)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("soldonce bench");
    let stdout = String::from_utf8_lossy(&bench.stdout);
    assert_eq!(
        bench.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("JSON report");

    let strategies = report["strategies"].as_array().expect("strategies");
    let names: Vec<&str> = strategies
        .iter()
        .filter_map(|s| s["strategy"].as_str())
        .collect();
    assert_eq!(names, STRATEGIES, "every strategy, in order");
    for s in strategies {
        let name = &s["strategy"];
        let runs = s["sellout"].as_array().expect("sellout runs");
        assert_eq!(runs.len(), 2, "{name}: two sellout runs");
        if name != "naive" {
            for run in runs {
                assert_eq!(
                    (
                        run["sold_in_database"].as_i64(),
                        run["sold_by_answers"].as_u64()
                    ),
                    (Some(1), Some(1)),
                    "{name} sells the one unit exactly once: {run}"
                );
            }
        }
        for case in ["hot", "many"] {
            assert!(
                s[case]["accepted"].as_u64().is_some_and(|n| n > 0),
                "{name} takes orders in the {case} case: {}",
                s[case]
            );
        }
    }

    let markdown = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    for name in STRATEGIES {
        assert!(
            markdown
                .lines()
                .any(|l| l.starts_with(&format!("| {name} |"))),
            "a row for {name}:\n{markdown}"
        );
    }
    let json: Value = serde_json::from_slice(
        &std::fs::read(out.path().join("report.json")).expect("report.json"),
    )
    .expect("report.json parses");
    assert_eq!(json["database"], report["database"]);
    let svg = std::fs::read_to_string(out.path().join("throughput.svg")).expect("throughput.svg");
    assert!(
        (svg.starts_with("<svg") || svg.starts_with("<?xml")) && svg.trim_end().ends_with("</svg>"),
        "an SVG document: {}",
        &svg[..svg.len().min(200)]
    );

    let database = report["database"].as_str().expect("database name");
    assert!(database.starts_with("soldonce_bench_"), "{database}");
    let mut admin = PgConnection::connect(&server)
        .await
        .expect("connect to test postgres");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(database)
        .fetch_one(&mut admin)
        .await
        .expect("count databases");
    assert_eq!(left, 0, "the bench dropped {database}");
}

/// The directory of the debug build's service binaries.
fn debug_bin_dir() -> PathBuf {
    binary("checkout")
        .parent()
        .expect("the target directory")
        .to_path_buf()
}

/// Runs `soldonce --json bench ARGS` (at most `limit`); its exit code, stdout and stderr.
async fn bench(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let run = tokio::process::Command::new(binary("soldonce"))
        .arg("--json")
        .arg("bench")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TMPDIR", std::env::temp_dir())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("soldonce bench {args:?} did not finish within {limit:?}"))
        .expect("run soldonce bench");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The saga's open loop follows every order to its end: the orders the load
/// generator saw accepted are the orders in the database, every one of them
/// confirmed by its state and by its own `order.confirmed` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saga_bench_confirms_every_order_it_accepted() {
    let dir = debug_bin_dir();
    let (code, stdout, stderr) = bench(
        &["saga", "--seconds", "2", "--cases", "hot", "--no-closed"]
            .into_iter()
            .chain(["--bin-dir", dir.to_str().expect("a UTF-8 path")])
            .collect::<Vec<_>>(),
        Duration::from_secs(240),
    )
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 1, "the hot case only: {report}");
    let open = &cases[0]["open"];
    assert_eq!(cases[0]["case"], "hot");
    assert!(cases[0]["closed"].is_null(), "--no-closed: {open}");
    let confirmed = open["confirmed"].as_u64().expect("confirmed");
    assert!(confirmed > 0, "orders were confirmed: {open}");
    assert_eq!(
        open["accepted"].as_u64(),
        Some(confirmed),
        "accepted = confirmed: {open}"
    );
    assert_eq!(
        open["accepted_in_database"].as_u64(),
        Some(confirmed),
        "{open}"
    );
    assert_eq!(
        open["orders"].as_u64(),
        Some(confirmed),
        "no order ended otherwise: {open}"
    );
    assert_eq!(
        open["to_confirmed"]["orders"].as_u64(),
        Some(confirmed),
        "one order.confirmed event per confirmed order: {open}"
    );
    assert!(
        open["to_confirmed"]["p99_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{open}"
    );
    // The warm-up's orders were followed to their end and then emptied:
    // the figures above count none of them.
    assert!(
        open["warm_up"]["orders"]
            .as_u64()
            .is_some_and(|n| n > 0 && n <= 600),
        "2 s at 300/s warmed up first: {open}"
    );
    assert!(
        open["cpu"]["ms_per_order"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{open}"
    );
    assert!(
        open["stages"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["stage"] == "outbox_commit_to_puback")),
        "the relay's stage was scraped: {open}"
    );
    assert!(
        report["machine"]["cores"].as_u64().is_some_and(|c| c > 0),
        "{report}"
    );
    assert_eq!(
        report["binaries"]["path"].as_str(),
        dir.canonicalize().ok().as_deref().and_then(Path::to_str)
    );
}

/// Both sides run the same loops on a fresh system each, and every figure
/// is given per side with its round and as a ratio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compare_bench_gives_both_sides_and_their_ratio() {
    let dir = debug_bin_dir();
    let dir = dir.to_str().expect("a UTF-8 path");
    let args = [
        "compare",
        "--before",
        dir,
        "--after",
        dir,
        "--after-env",
        "RUST_LOG=warn",
        "--rounds",
        "1",
        "--seconds",
        "2",
        "--cases",
        "hot",
    ];
    let (code, stdout, stderr) = bench(&args, Duration::from_secs(300)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    assert_eq!(report["after"]["env"], serde_json::json!(["RUST_LOG=warn"]));
    for side in ["before", "after"] {
        let runs = report["runs"][side].as_array().expect("runs");
        assert_eq!(runs.len(), 1, "one round of {side}");
        let open = &runs[0]["cases"][0]["open"];
        assert!(
            open["confirmed"].as_u64().is_some_and(|n| n > 0),
            "{side}: {open}"
        );
        let closed = &runs[0]["cases"][0]["closed"];
        assert!(
            closed["settled_per_second"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{side}: {closed}"
        );
    }
    let figures = report["figures"].as_array().expect("figures");
    for name in [
        "open: 202 → confirmed p99 (ms)",
        "closed: settled orders/s",
        "closed: accepted orders/s",
    ] {
        let f = figures
            .iter()
            .find(|f| f["case"] == "hot" && f["figure"] == name)
            .unwrap_or_else(|| panic!("{name} is compared: {figures:?}"));
        for side in ["before", "after"] {
            assert_eq!(f[side]["rounds"].as_array().map(Vec::len), Some(1), "{f}");
            assert_eq!(
                f[side]["median"], f[side]["rounds"][0],
                "one round's median is that round: {f}"
            );
        }
        let ratio = f["ratio"].as_f64().expect("a ratio");
        let (before, after) = (
            f["before"]["median"].as_f64().expect("before"),
            f["after"]["median"].as_f64().expect("after"),
        );
        assert!((ratio - after / before).abs() < 1e-9, "{f}");
    }
}

/// A bin dir without one of the services is bad input: one line naming
/// the option, the directory and the binary, exit 2, and no server started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compare_with_a_bin_dir_missing_a_service_is_refused() {
    let empty = tempfile::tempdir().expect("tempdir");
    std::fs::copy(binary("checkout"), empty.path().join("checkout")).expect("copy checkout");
    let bad = empty.path().to_str().expect("a UTF-8 path");
    let good = debug_bin_dir();
    let started = Instant::now();
    let (code, stdout, stderr) = bench(
        &[
            "compare",
            "--before",
            bad,
            "--after",
            good.to_str().expect("a UTF-8 path"),
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert_eq!(stdout, "", "nothing measured");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("--before")
            && lines[0].contains(bad)
            && lines[0].contains("outbox-relay"),
        "names the option, the directory and what it lacks: {stderr}"
    );
    // Starting PostgreSQL alone takes seconds: refused before anything started.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// `scripts/bench/checkout.pgbench.sql` (the floor `checkout.sh` and
/// `coalesce.sh` put checkout beside) runs on today's schema: pgbench runs it
/// five times, and each run reserved one unit, by the SKU's buckets and by
/// the orders, ledger rows and outbox rows it wrote. The scripts send
/// pgbench's errors to /dev/null, so a migration that renamed a column it
/// moves would otherwise only show as a bench that stops short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkout_shaped_pgbench_script_reserves_one_unit_per_run_on_todays_schema() {
    let url = servers::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    store::bench::seed_products(&pool, &["BENCH-0"], 4990, 100)
        .await
        .expect("seed the SKU");
    // The account the script's orders belong to, as scripts/bench/lib.sh seeds it.
    sqlx::query("INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000be', 'pgbench')")
        .execute(&pool)
        .await
        .expect("seed the account");
    let script = bench_script("checkout.pgbench.sql");
    let args = [
        "-n", "-M", "prepared", "-c", "1", "-t", "5", "-D", "skus=1", "-f",
    ];
    run_on_database("pgbench", &args.map(String::from), &script, &url).await;
    let (available, reserved, sold): (i64, i64, i64) =
        sqlx::query_as("SELECT available, reserved, sold FROM stock_buckets WHERE sku = 'BENCH-0'")
            .fetch_one(&pool)
            .await
            .expect("the SKU's buckets");
    assert_eq!(
        (available, reserved, sold),
        (95, 5, 0),
        "five units reserved"
    );
    let written: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE state = 'payment_pending'), \
                (SELECT coalesce(sum(d_reserved), 0)::bigint FROM stock_ledger WHERE movement = 'reserve'), \
                (SELECT coalesce(sum(cardinality(positions)), 0)::bigint FROM outbox)",
    )
    .fetch_one(&pool)
    .await
    .expect("what the runs wrote");
    assert_eq!(
        written,
        (5, 5, 5),
        "pending orders, units reserved in the ledger, events waiting in the outbox"
    );
    pool.close().await;
}

/// `scripts/bench/money.seed.sql` (the books `money.sh` times the audit and
/// the reconciliation over) writes, on today's schema, orders exactly as the
/// services would: 300 seeded orders are every one confirmed, paid and
/// shipped by the tables, and `soldonce audit` finds them clean. A
/// migration that changed a table the seed writes would otherwise show only
/// as a money bench that stops, or audits a violation, at its first step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_money_seed_writes_orders_the_audit_finds_clean_on_todays_schema() {
    let url = servers::fresh_database().await;
    let script = bench_script("money.seed.sql");
    let t0 = chrono::Utc::now().timestamp() / 86_400 * 86_400 - 30 * 86_400;
    let vars = ["ON_ERROR_STOP=1", "from=1", "to=300", &format!("t0={t0}")];
    let mut args = vec!["-qtA".to_owned()];
    args.extend(vars.iter().flat_map(|v| ["-v".to_owned(), (*v).to_owned()]));
    args.push("-f".to_owned());
    run_on_database("psql", &args, &script, &url).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let seeded: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE state = 'confirmed'), \
                (SELECT count(*) FROM payments WHERE disposition = 'attached'), \
                (SELECT count(*) FROM shipments)",
    )
    .fetch_one(&pool)
    .await
    .expect("what the seed wrote");
    assert_eq!(
        seeded,
        (300, 300, 300),
        "confirmed orders, their payments, their shipments"
    );
    pool.close().await;
    let audit = tokio::process::Command::new(binary("soldonce"))
        .args(["--json", "audit"])
        .env("DATABASE_URL", &url)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run soldonce audit");
    assert!(
        audit.status.success(),
        "the audit found the seeded books wrong:\n{}\n{}",
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );
}

/// A script of `scripts/bench/`.
fn bench_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts/bench")
        .join(name)
}

/// Runs PostgreSQL's `program` (pgbench, psql) with `args`, then `script`
/// and the database `url`, as the bench scripts do; fails the test with its
/// errors unless it succeeds.
async fn run_on_database(program: &str, args: &[String], script: &Path, url: &str) {
    let run = tokio::process::Command::new(program)
        .args(args)
        .arg(script)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("run {program} (PostgreSQL's bin directory on PATH, as deploy/setup.sh puts it): {e}")
        });
    assert!(
        run.status.success(),
        "{program} failed on {}:\n{}",
        script.display(),
        String::from_utf8_lossy(&run.stderr)
    );
}
