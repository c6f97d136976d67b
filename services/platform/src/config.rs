//! Reading configuration from the environment. Every failure names the
//! variable, so `main` can print one line and exit with code 2.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Every variable read so far, and whether it was required: what
/// `--check-config` reports, so deployments can be checked against it.
static READS: Mutex<BTreeMap<String, bool>> = Mutex::new(BTreeMap::new());
/// Each variable's default, as `--help` shows it.
static DEFAULTS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
/// Reading for `--help`: as if the environment were empty, required
/// variables given a placeholder, so every variable is reached.
static DESCRIBING: AtomicBool = AtomicBool::new(false);

fn note_default(name: &str, default: impl Display) {
    if let Ok(mut defaults) = DEFAULTS.lock() {
        defaults.insert(name.to_owned(), default.to_string());
    }
}

/// What a required variable reads as for `--help`: a value its checks take.
fn placeholder(name: &str) -> String {
    match name {
        "DATABASE_URL" => "postgres://help@127.0.0.1/help".into(),
        "NATS_URL" => "nats://127.0.0.1:4222".into(),
        n if n.ends_with("_URL") => "http://127.0.0.1:1".into(),
        _ => "help".repeat(16),
    }
}

fn note(name: &str, required: bool) {
    if let Ok(mut reads) = READS.lock() {
        let entry = reads.entry(name.to_owned()).or_insert(required);
        *entry |= required;
    }
}

/// Records a variable read by code outside this module (e.g. a service
/// with its own parser), for `--check-config`.
pub fn note_read(name: &str, required: bool) {
    note(name, required);
}

/// A missing or malformed setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {reason}")]
pub struct ConfigError {
    pub name: String,
    pub reason: String,
}

impl ConfigError {
    /// A setting `name` that is wrong because of `reason`.
    pub fn new(name: &str, reason: impl Display) -> Self {
        ConfigError {
            name: name.to_owned(),
            reason: reason.to_string(),
        }
    }
}

fn raw(name: &str) -> Result<Option<String>, ConfigError> {
    note(name, false);
    if DESCRIBING.load(Ordering::Relaxed) {
        return Ok(None);
    }
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::new(name, "is not valid UTF-8")),
    }
}

/// How far a signed webhook's timestamp may be from our clock. Webhook
/// receipts (the replay fence) must be kept longer than this.
pub const WEBHOOK_TOLERANCE: Duration = Duration::from_secs(300);

/// A required variable.
pub fn required(name: &str) -> Result<String, ConfigError> {
    note(name, true);
    if DESCRIBING.load(Ordering::Relaxed) {
        return Ok(placeholder(name));
    }
    raw(name)?.ok_or_else(|| ConfigError::new(name, "is required but not set"))
}

/// An optional variable.
pub fn optional(name: &str) -> Result<Option<String>, ConfigError> {
    raw(name)
}

/// A parsed variable with a default.
pub fn parsed<T>(name: &str, default: T) -> Result<T, ConfigError>
where
    T: FromStr + Display,
    T::Err: Display,
{
    note_default(name, &default);
    match raw(name)? {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|e| ConfigError::new(name, format!("cannot parse {v:?}: {e}"))),
    }
}

/// A humantime duration (`15m`, `200ms`) with a default.
pub fn duration(name: &str, default: Duration) -> Result<Duration, ConfigError> {
    note_default(name, humantime::format_duration(default));
    match raw(name)? {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v.trim()).map_err(|e| {
            ConfigError::new(
                name,
                format!("cannot parse {v:?} as a duration like 15m or 200ms: {e}"),
            )
        }),
    }
}

/// A PostgreSQL URL (`postgres://…`).
pub fn database_url() -> Result<String, ConfigError> {
    let url = required("DATABASE_URL")?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConfigError::new(
            "DATABASE_URL",
            "must start with postgres:// or postgresql://",
        ));
    }
    Ok(url)
}

/// `SSL_CERT_FILE`, when set: a PEM file of the certificates an https
/// client trusts (with Mozilla's roots; it replaces the platform's store,
/// as every rustls and OpenSSL client reads it). Read now, so a missing or
/// empty file is one line at start instead of a failure on every call.
pub fn ssl_cert_file() -> Result<Option<String>, ConfigError> {
    let Some(path) = optional("SSL_CERT_FILE")? else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::new("SSL_CERT_FILE", format!("cannot read {path}: {e}")))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(ConfigError::new(
            "SSL_CERT_FILE",
            format!("{path} holds no PEM certificate"),
        ));
    }
    Ok(Some(path))
}

/// `--version` and `--help`, answered before anything starts: the version,
/// or a usage with every variable `read` reaches (required, or its
/// default), read as if the environment were empty. `None` when neither
/// was asked for.
pub fn answer_version_or_help<T>(
    binary: &str,
    about: &str,
    read: impl FnOnce() -> Result<T, ConfigError>,
) -> Option<String> {
    let asked = |flag: &str| std::env::args().skip(1).any(|a| a == flag);
    let version = env!("CARGO_PKG_VERSION");
    if asked("--version") || asked("-V") {
        return Some(format!("{binary} {version}"));
    }
    if !(asked("--help") || asked("-h")) {
        return None;
    }
    DESCRIBING.store(true, Ordering::Relaxed);
    let complete = read().is_ok();
    DESCRIBING.store(false, Ordering::Relaxed);
    let reads = READS.lock().map(|r| r.clone()).unwrap_or_default();
    let defaults = DEFAULTS.lock().map(|d| d.clone()).unwrap_or_default();
    let width = reads.keys().map(String::len).max().unwrap_or(0);
    let mut text = format!(
        "{binary} {version}: {about}\n\nUsage: {binary} [--check-config | --help | --version]\n  \
         --check-config  print whether the settings are valid and every variable read, as JSON; exit 0 or 2\n\n\
         Settings, from the environment (what each means: the README's Configuration table):\n"
    );
    for (name, required) in &reads {
        let how = match (required, defaults.get(name)) {
            (true, _) => "required".to_owned(),
            (false, Some(d)) => format!("default {d}"),
            (false, None) => "optional".to_owned(),
        };
        text.push_str(&format!("  {name:<width$}  {how}\n"));
    }
    if !complete {
        text.push_str("  (and more, read once these are set)\n");
    }
    Some(text)
}

/// Loads a service's settings. With `--check-config` it prints, as JSON,
/// whether they are valid and every variable the service reads (`true` when
/// required), then exits (0 if valid, 2 if not). Otherwise an invalid
/// setting prints one line and exits with code 2.
pub fn load<T>(read: impl FnOnce() -> Result<T, ConfigError>) -> T {
    let result = read();
    if std::env::args().skip(1).any(|a| a == "--check-config") {
        let reads = READS.lock().map(|r| r.clone()).unwrap_or_default();
        let error = result.as_ref().err().map(ToString::to_string);
        println!(
            "{}",
            serde_json::json!({ "valid": error.is_none(), "error": error, "reads": reads })
        );
        std::process::exit(if error.is_none() { 0 } else { 2 });
    }
    exit_on_error(result)
}

/// Prints the error as one line and exits with code 2.
pub fn exit_on_error<T>(result: Result<T, ConfigError>) -> T {
    match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("configuration error: {e}");
            std::process::exit(2);
        }
    }
}
