//! `soldonce bench flash-sale` against the test server, run as an operator
//! runs it: every strategy that must not oversell sells the one unit once in
//! every sellout run, by its answers and by the database; every strategy
//! takes orders under load; the reports are written; the bench's own
//! database is gone afterwards.

use serde_json::Value;
use soldonce_tests::relay::binary;
use soldonce_tests::servers;
use sqlx::{Connection, PgConnection};

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
