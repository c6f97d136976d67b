//! `deploy/compose.yaml` runs binaries of this workspace, setting exactly
//! the variables each reads and all that it requires; every service turns
//! bad configuration into exit code 2 and one line naming the variable.

use soldonce_tests::relay::binary;
use soldonce_tests::system::SERVICES;
use std::collections::{BTreeMap, BTreeSet};
use yaml_rust2::{Yaml, YamlLoader};

fn compose() -> Yaml {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/compose.yaml");
    YamlLoader::load_from_str(&text)
        .expect("valid YAML")
        .remove(0)
}

/// A mapping with `<<` merge keys applied.
fn merged(node: &Yaml) -> BTreeMap<String, Yaml> {
    let mut out = BTreeMap::new();
    if let Some(map) = node.as_hash() {
        if let Some(base) = map.get(&Yaml::String("<<".into())) {
            out.extend(merged(base));
        }
        for (k, v) in map {
            if let Some(k) = k.as_str().filter(|k| *k != "<<") {
                out.insert(k.to_owned(), v.clone());
            }
        }
    }
    out
}

/// `${VAR:-default}` → `default`, as compose would with VAR unset;
/// `${VAR:?message}` (no default: the operator must set it) → a test value.
fn interpolate(value: &str) -> String {
    let inner = value.strip_prefix("${").and_then(|v| v.strip_suffix('}'));
    if let Some((_, default)) = inner.and_then(|v| v.split_once(":-")) {
        return default.to_owned();
    }
    match inner.and_then(|v| v.split_once(":?")) {
        Some(("WEBHOOK_SECRET", _)) => soldonce_tests::app::WEBHOOK_SECRET.to_owned(),
        Some(("CONSOLE_TOKEN", _)) => "an-operator-token-of-enough-characters".to_owned(),
        Some((name, _)) => panic!("no test value for the required {name}"),
        None => value.to_owned(),
    }
}

#[test]
fn compose_ships_no_secret_and_refuses_to_start_without_one() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose.yaml"),
    )
    .expect("compose");
    assert!(
        !text.contains("whsec_c29s") && !text.contains(":-whsec_"),
        "no default signing secret in the shipped file"
    );
    let services = merged(&compose()["services"]);
    for name in ["checkout", "psp-sim"] {
        let env = merged(
            merged(&services[name])
                .get("environment")
                .expect("environment"),
        );
        let secret = env["WEBHOOK_SECRET"].as_str().expect("WEBHOOK_SECRET");
        assert!(
            secret.starts_with("${WEBHOOK_SECRET:?") && secret.contains("WEBHOOK_SECRET"),
            "{name}: compose stops with a message naming it: {secret}"
        );
    }
}

#[test]
fn compose_runs_workspace_binaries_with_exactly_the_variables_they_read() {
    let doc = compose();
    let services = merged(&doc["services"]);
    let mut seen = BTreeSet::new();
    for (name, node) in &services {
        let service = merged(node);
        if service.get("image").and_then(Yaml::as_str) != Some("soldonce:latest") {
            continue;
        }
        let Some(command) = service.get("command").and_then(Yaml::as_vec) else {
            continue;
        };
        let program = command[0].as_str().expect("command is a list of strings");
        let path = binary(program);
        seen.insert(program.to_owned());
        let env: BTreeMap<String, String> =
            merged(service.get("environment").unwrap_or(&Yaml::Null))
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        interpolate(
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| format!("{}", v.as_i64().unwrap_or_default()))
                                .as_str(),
                        ),
                    )
                })
                .collect();
        if program == "soldonce" {
            let sub = command.get(1).and_then(Yaml::as_str);
            assert!(
                matches!(sub, Some("migrate" | "console")),
                "{name}: the CLI only migrates and serves the console here"
            );
            assert!(
                env.contains_key("DATABASE_URL"),
                "{name}: {sub:?} needs DATABASE_URL"
            );
            if sub == Some("console") {
                assert!(
                    env.get("CONSOLE_TOKEN").is_some_and(|t| t.len() >= 24),
                    "{name}: the console needs an operator token"
                );
            }
            continue;
        }
        // psp-sim's data directory is the container's; check a private one here.
        let scratch = tempfile::tempdir().expect("scratch dir");
        let mut env = env;
        if env.contains_key("PSP_SIM_DATA_DIR") {
            env.insert(
                "PSP_SIM_DATA_DIR".into(),
                scratch.path().display().to_string(),
            );
        }
        let out = std::process::Command::new(&path)
            .arg("--check-config")
            .env_clear()
            .envs(&env)
            .output()
            .expect("run --check-config");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{name}: --check-config printed {:?} {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(
            report["valid"], true,
            "{name}: compose's configuration is invalid: {report}"
        );
        let reads = report["reads"].as_object().expect("reads");
        for key in env.keys() {
            assert!(
                key == "RUST_LOG" || reads.contains_key(key),
                "{name} sets {key}, which {program} never reads"
            );
        }
        for (key, required) in reads {
            if required == true {
                assert!(
                    env.contains_key(key),
                    "{name} does not set {key}, which {program} requires"
                );
            }
        }
    }
    for service in SERVICES {
        assert!(seen.contains(*service), "compose runs no {service}");
    }
}

#[test]
fn every_service_turns_bad_configuration_into_exit_2_and_one_line_naming_it() {
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (
            "checkout",
            &[("DATABASE_URL", "mysql://nope")],
            "DATABASE_URL",
        ),
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("RESERVATION_TTL", "soon"),
            ],
            "RESERVATION_TTL",
        ),
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("CHECKOUT_COALESCE_THREAD", "dedicated"),
            ],
            "CHECKOUT_COALESCE_THREAD",
        ),
        (
            "outbox-relay",
            &[("DATABASE_URL", "postgres://x/y")],
            "NATS_URL",
        ),
        (
            "payment-worker",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("PSP_URL", "ftp://psp"),
            ],
            "PSP_URL",
        ),
        (
            "expiry",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("EXPIRY_INTERVAL", "0s"),
            ],
            "EXPIRY_INTERVAL",
        ),
        (
            "expiry",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("EXPIRY_CONCURRENCY", "0"),
            ],
            "EXPIRY_CONCURRENCY",
        ),
        (
            "expiry",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("EXPIRY_CONCURRENCY", "17"),
            ],
            "EXPIRY_CONCURRENCY",
        ),
        (
            "fulfillment",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("FULFILLMENT_STEP_DELAY", "-1"),
            ],
            "FULFILLMENT_STEP_DELAY",
        ),
        // Counts out of their range, each read by `Var::in_range`.
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("CHECKOUT_COALESCE_MAX", "0"),
            ],
            "CHECKOUT_COALESCE_MAX",
        ),
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("CHECKOUT_COALESCE_LANES", "65"),
            ],
            "CHECKOUT_COALESCE_LANES",
        ),
        (
            "outbox-relay",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("OUTBOX_BATCH_SIZE", "10001"),
            ],
            "OUTBOX_BATCH_SIZE",
        ),
        (
            "outbox-relay",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("OUTBOX_RELAY_LANES", "0"),
            ],
            "OUTBOX_RELAY_LANES",
        ),
        (
            "outbox-relay",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("STREAM_REPLICAS", "6"),
            ],
            "STREAM_REPLICAS",
        ),
        (
            "expiry",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("EXPIRY_BATCH_SIZE", "100001"),
            ],
            "EXPIRY_BATCH_SIZE",
        ),
        (
            "payment-worker",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("PSP_URL", "http://127.0.0.1:1"),
                ("PAYMENT_WORKER_CONCURRENCY", "1025"),
            ],
            "PAYMENT_WORKER_CONCURRENCY",
        ),
        // A consumer with no recorder would never commit; one with hundreds would swamp the pool.
        (
            "payment-worker",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("PSP_URL", "http://127.0.0.1:1"),
                ("CONSUMER_RECORDERS", "0"),
            ],
            "CONSUMER_RECORDERS",
        ),
        (
            "payment-worker",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("PSP_URL", "http://127.0.0.1:1"),
                ("CAPTURE_CONCURRENCY", "0"),
            ],
            "CAPTURE_CONCURRENCY",
        ),
        (
            "fulfillment",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("NATS_URL", "nats://x"),
                ("CONSUMER_RECORDERS", "65"),
            ],
            "CONSUMER_RECORDERS",
        ),
        (
            "psp-sim",
            &[("PSP_SIM_ADDR", "not an address")],
            "PSP_SIM_ADDR",
        ),
        (
            "psp-sim",
            &[("PSP_FAULTS", r#"{"decline_rate": 2}"#)],
            "PSP_FAULTS",
        ),
        // Signing keys: empty or shorter than 24 bytes are refused by both ends.
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("WEBHOOK_SECRET", "whsec_"),
            ],
            "WEBHOOK_SECRET",
        ),
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("WEBHOOK_SECRET", "whsec_c2hvcnQ="),
            ],
            "WEBHOOK_SECRET",
        ),
        (
            "psp-sim",
            &[
                ("PSP_WEBHOOK_URL", "http://127.0.0.1:1/h"),
                ("WEBHOOK_SECRET", "whsec_c2hvcnQ="),
            ],
            "WEBHOOK_SECRET",
        ),
        // Logs are JSON or text; a service reading its settings through
        // platform and psp-sim say so alike.
        (
            "checkout",
            &[("DATABASE_URL", "postgres://x/y"), ("LOG_FORMAT", "bogus")],
            "LOG_FORMAT",
        ),
        ("psp-sim", &[("LOG_FORMAT", "logfmt")], "LOG_FORMAT"),
        (
            "expiry",
            &[("DATABASE_URL", "postgres://x/y"), ("RUST_LOG", "info,[")],
            "RUST_LOG",
        ),
        // A runtime size that is not a positive number of threads, in a
        // service that reads its settings through platform and in psp-sim.
        (
            "checkout",
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("TOKIO_WORKER_THREADS", "0"),
            ],
            "TOKIO_WORKER_THREADS",
        ),
        (
            "psp-sim",
            &[("TOKIO_WORKER_THREADS", "two")],
            "TOKIO_WORKER_THREADS",
        ),
        // Receipts kept shorter than the webhook tolerance would reopen replay.
        (
            "expiry",
            &[("DATABASE_URL", "postgres://x/y"), ("RETENTION", "5m")],
            "RETENTION",
        ),
    ];
    for (service, env, names) in cases {
        let out = std::process::Command::new(binary(service))
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{service} {env:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{service}: one line, got {stderr:?}"
        );
        assert!(
            stderr.contains(names),
            "{service}: the line names {names}: {stderr:?}"
        );
    }
    // The CLI sizes its runtime the same way, before it does anything.
    let out = std::process::Command::new(binary("soldonce"))
        .args(["migrate"])
        .env_clear()
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .env("TOKIO_WORKER_THREADS", "-1")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "soldonce: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "soldonce: {stderr:?}");
    assert!(
        stderr.contains("TOKIO_WORKER_THREADS"),
        "soldonce: {stderr:?}"
    );
}

/// Runs `binary` with `args` and only `env` (and PATH): exit code, stdout.
fn run_with(binary_name: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(binary(binary_name))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run the binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn every_binary_answers_version_and_help_without_starting_and_help_names_every_variable() {
    // Settings every service would take, so --check-config reads them all.
    let valid: Vec<(&str, &str)> = vec![
        ("DATABASE_URL", "postgres://u@127.0.0.1:1/db"),
        ("NATS_URL", "nats://127.0.0.1:1"),
        ("PSP_URL", "http://127.0.0.1:1"),
        ("WEBHOOK_SECRET", soldonce_tests::app::WEBHOOK_SECRET),
    ];
    for service in SERVICES.iter().copied().chain(["soldonce"]) {
        // Nothing set: neither flag may need a setting, bind a port or wait.
        let (code, text) = run_with(service, &["--version"], &[]);
        assert_eq!(code, Some(0), "{service} --version: {text}");
        assert_eq!(
            text.trim(),
            format!("{service} {}", env!("CARGO_PKG_VERSION")),
            "{service} --version"
        );
        let (code, help) = run_with(service, &["--help"], &[]);
        assert_eq!(code, Some(0), "{service} --help: {help}");
        assert!(help.contains("Usage"), "{service} --help: {help}");
        if service == "soldonce" {
            continue;
        }
        let (code, checked) = run_with(service, &["--check-config"], &valid);
        assert_eq!(code, Some(0), "{service} --check-config: {checked}");
        let report: serde_json::Value = serde_json::from_str(checked.trim()).expect("JSON");
        let reads = report["reads"].as_object().expect("reads");
        assert!(reads.len() > 1, "{service}: {reads:?}");
        let settings = report["settings"].as_array().expect("settings");
        for name in reads.keys() {
            assert!(
                settings.iter().any(|s| s["name"] == name.as_str()),
                "{service}: {name} is read but not declared: {report}"
            );
        }
        // Each on one line: its name, required or its default, its meaning.
        for setting in settings {
            let name = setting["name"].as_str().expect("name");
            let line = help
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .unwrap_or_else(|| panic!("{service} --help names {name}:\n{help}"));
            let how = match (setting["required"].as_bool(), setting["default"].as_str()) {
                (Some(true), _) => "required".to_owned(),
                (_, Some(default)) => format!("default {default}"),
                _ => "optional".to_owned(),
            };
            let meaning = setting["meaning"].as_str().expect("meaning");
            assert!(
                !meaning.is_empty() && line.contains(&how) && line.trim_end().ends_with(meaning),
                "{service} --help: {name}, {how}, {meaning:?}:\n{line}"
            );
        }
    }
}
