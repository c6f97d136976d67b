//! docs/reference.md's configuration table is what the services declare.
//! Each setting's name, default and meaning are declared once, where it is
//! read (`platform::config::var`); every binary lists its own with
//! `--check-config`, and the table must hold exactly those rows: one per
//! variable, sorted by name. `UPDATE_REFERENCE=1` rewrites the table from
//! the declarations instead of failing.

use soldonce_tests::relay::binary;
use soldonce_tests::system::SERVICES;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The table's header; the rows follow its separator line.
const HEADER: &str = "| variable | used by | default | meaning |";

/// One variable as the services declare it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    users: Vec<&'static str>,
    required: bool,
    default: Option<String>,
    meaning: String,
}

fn reference_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md")
}

/// Every setting each service binary declares (`--check-config`'s
/// `settings`, read with nothing set), merged across binaries.
fn declared() -> BTreeMap<String, Setting> {
    let mut all: BTreeMap<String, Setting> = BTreeMap::new();
    for service in SERVICES {
        let out = std::process::Command::new(binary(service))
            .arg("--check-config")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .expect("run --check-config");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{service} --check-config is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let settings = report["settings"].as_array().expect("settings");
        assert!(settings.len() > 2, "{service}: {report}");
        for s in settings {
            let name = s["name"].as_str().expect("name").to_owned();
            let this = Setting {
                users: vec![service],
                required: s["required"].as_bool().expect("required"),
                default: s["default"].as_str().map(str::to_owned),
                meaning: s["meaning"].as_str().expect("meaning").to_owned(),
            };
            assert!(
                !this.meaning.contains('|')
                    && !this.meaning.contains('\n')
                    && !this.meaning.is_empty(),
                "{service}: {name}'s meaning must be one line without '|' (a table cell): {:?}",
                this.meaning
            );
            match all.get_mut(&name) {
                None => {
                    all.insert(name, this);
                }
                Some(known) => {
                    let same = (known.required, &known.default, &known.meaning)
                        == (this.required, &this.default, &this.meaning);
                    assert!(
                        same,
                        "{name} is declared one way in {} and another in {service} \
                         ({known:?} against {this:?}): declare it once, in the crate both use",
                        known.users.join(", ")
                    );
                    known.users.push(service);
                }
            }
        }
    }
    all
}

/// The table row of a setting.
fn row(name: &str, s: &Setting) -> String {
    let users = if s.users.len() == SERVICES.len() {
        "every service".to_owned()
    } else if s.users.len() == SERVICES.len() - 1 && !s.users.contains(&"psp-sim") {
        "every service but psp-sim".to_owned()
    } else {
        s.users.join(", ")
    };
    let default = match (&s.default, s.required) {
        (_, true) => "— (required)".to_owned(),
        (Some(d), false) if d.contains(' ') => d.clone(),
        (Some(d), false) => format!("`{d}`"),
        (None, false) => "none".to_owned(),
    };
    format!("| `{name}` | {users} | {default} | {} |", s.meaning)
}

/// The table's rows in `doc`, and the range of lines they take.
fn table(doc: &str) -> (std::ops::Range<usize>, Vec<&str>) {
    let lines: Vec<&str> = doc.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.trim() == HEADER)
        .unwrap_or_else(|| panic!("docs/reference.md has no table headed {HEADER}"));
    let first = header + 2;
    let end = lines[first..]
        .iter()
        .position(|l| !l.starts_with('|'))
        .map_or(lines.len(), |n| first + n);
    (first..end, lines[first..end].to_vec())
}

/// The variable a row is about (its first cell, without backticks).
fn row_name(row: &str) -> String {
    row.trim_start_matches('|')
        .split('|')
        .next()
        .unwrap_or("")
        .trim()
        .trim_matches('`')
        .to_owned()
}

/// What to change in the table's `rows` for it to be `expected` (rows by
/// variable): one instruction per row, naming the variable.
fn changes(expected: &BTreeMap<String, String>, rows: &[&str]) -> Vec<String> {
    let documented: BTreeMap<String, &str> = rows.iter().map(|r| (row_name(r), *r)).collect();
    let mut changes = Vec::new();
    for (name, want) in expected {
        match documented.get(name) {
            None => changes.push(format!("add the row of {name}:\n  {want}")),
            Some(have) if have != want => changes.push(format!(
                "replace the row of {name}:\n  {have}\nwith\n  {want}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|n| !expected.contains_key(*n)) {
        changes.push(format!("remove the row of {name}: no service reads it"));
    }
    if rows.len() != documented.len() {
        changes.push("keep one row per variable".to_owned());
    }
    let order: Vec<String> = rows.iter().map(|r| row_name(r)).collect();
    if changes.is_empty() && !order.iter().eq(expected.keys()) {
        changes.push("sort the rows by variable".to_owned());
    }
    changes
}

#[test]
fn the_configuration_table_is_every_setting_the_services_declare() {
    let expected: BTreeMap<String, String> = declared()
        .iter()
        .map(|(name, s)| (name.clone(), row(name, s)))
        .collect();
    let path = reference_path();
    let doc = std::fs::read_to_string(&path).expect("docs/reference.md");
    let (lines, rows) = table(&doc);
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        let mut out: Vec<&str> = doc.lines().collect();
        out.splice(lines, expected.values().map(String::as_str));
        std::fs::write(&path, out.join("\n") + "\n").expect("rewrite docs/reference.md");
        return;
    }
    let changes = changes(&expected, &rows);
    assert!(
        changes.is_empty(),
        "docs/reference.md's configuration table differs from what the services declare \
         (each setting's meaning and default live beside the code that reads it, platform::config::var). \
         Change the table, or run this test with UPDATE_REFERENCE=1 to rewrite it:\n\n{}",
        changes.join("\n\n")
    );
}

#[test]
fn a_missing_a_stale_and_a_changed_row_are_each_named() {
    let setting = |meaning: &str| Setting {
        users: vec!["expiry"],
        required: false,
        default: Some("1s".into()),
        meaning: meaning.into(),
    };
    let kept = row("EXPIRY_INTERVAL", &setting("how often"));
    assert_eq!(kept, "| `EXPIRY_INTERVAL` | expiry | `1s` | how often |");
    let expected = BTreeMap::from([
        ("EXPIRY_INTERVAL".to_owned(), kept.clone()),
        ("NEW".to_owned(), row("NEW", &setting("new"))),
        ("RETENTION".to_owned(), row("RETENTION", &setting("now"))),
    ]);
    let doc = format!(
        "# x\n\n{HEADER}\n|---|---|---|---|\n{kept}\n| `GONE` | expiry | `1` | old |\n{}\n\nafter\n",
        row("RETENTION", &setting("then"))
    );
    let (lines, rows) = table(&doc);
    assert_eq!(lines, 4..7);
    let said = changes(&expected, &rows);
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(said[0].starts_with("add the row of NEW"), "{said:?}");
    assert!(
        said[1].starts_with("replace the row of RETENTION"),
        "{said:?}"
    );
    assert!(said[2].starts_with("remove the row of GONE"), "{said:?}");
    let in_order = [kept.as_str(), &expected["NEW"], &expected["RETENTION"]];
    assert!(changes(&expected, &in_order).is_empty());
    let shuffled = [in_order[1], in_order[0], in_order[2]];
    assert_eq!(changes(&expected, &shuffled), ["sort the rows by variable"]);
}
