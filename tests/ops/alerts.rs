//! The alerting rules an operator loads (`deploy/alerts.yml`): valid for
//! Prometheus (`promtool check rules`), each one firing on its series and
//! quiet below its threshold (`promtool test rules deploy/alerts.test.yml`),
//! and watching only metrics soldonce really exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (install Debian's prometheus: . deploy/setup.sh)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every `soldonce_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("soldonce_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_alerting_rules_are_valid_and_each_fires_on_its_series_and_stays_quiet_below_it() {
    let check = promtool(&["check", "rules", "alerts.yml"]);
    let rules = std::fs::read_to_string(deploy().join("alerts.yml")).expect("alerts.yml");
    let alerts = alert_names(&rules);
    assert!(
        check.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{check}"
    );
    for runbook_alarm in [
        "SoldonceStuckReservations",
        "SoldonceOutboxBacklog",
        "SoldonceOutboxParked",
        "SoldonceDeadLetters",
        "SoldonceAuditViolations",
        "SoldonceReconciliationFindings",
        "SoldonceCompensationsOverdue",
        "SoldonceConsumerLag",
    ] {
        assert!(
            alerts.iter().any(|a| a == runbook_alarm),
            "{runbook_alarm} has a rule"
        );
    }

    // One test that fires and one that stays quiet, per alert.
    let tests = std::fs::read_to_string(deploy().join("alerts.test.yml")).expect("alerts.test.yml");
    for alert in &alerts {
        for case in ["fires", "stays quiet"] {
            assert!(
                tests.contains(&format!("name: {alert} {case}")),
                "alerts.test.yml has a test: {alert} {case}"
            );
        }
    }
    let run = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(run.contains("SUCCESS"), "{run}");
}

#[test]
fn composes_prometheus_profile_loads_the_alerts_and_scrapes_every_service() {
    let check = promtool(&["check", "config", "prometheus.yml"]);
    assert!(check.contains("SUCCESS"), "{check}");
    let config = std::fs::read_to_string(deploy().join("prometheus.yml")).expect("prometheus.yml");
    assert!(config.contains("- alerts.yml"), "the alerts are loaded");
    for service in soldonce_tests::system::SERVICES {
        assert!(
            config.contains(&format!("job_name: {service}")),
            "{service} is scraped"
        );
    }
}

#[test]
fn every_metric_an_alert_watches_is_one_a_service_exports() {
    let rules = std::fs::read_to_string(deploy().join("alerts.yml")).expect("alerts.yml");
    let mut exported = BTreeSet::new();
    let services = Path::new(env!("CARGO_MANIFEST_DIR")).join("../services");
    for entry in walk(&services) {
        if entry.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&entry).expect("source");
            // Names are string literals, often a line below their macro.
            for literal in source.split("\"soldonce_").skip(1) {
                exported.extend(
                    metric_names(&format!("soldonce_{literal}"))
                        .into_iter()
                        .take(1),
                );
            }
        }
    }
    // The rules' prose names metrics too (descriptions); every one must exist.
    let watched = metric_names(&rules);
    assert!(watched.len() >= 8, "{watched:?}");
    let missing: Vec<&String> = watched.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "alerts name metrics nothing exports: {missing:?}"
    );
}

/// Every file under `dir`, depth first.
pub(super) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
