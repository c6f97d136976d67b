//! Reading configuration from the environment. Every setting is declared
//! once, where it is read, as a [`Var`]: its variable's name and what it
//! means, in one line. What a service reads is what `--help` lists (name,
//! default or required, meaning) and `--check-config` reports as JSON, from
//! which docs/reference.md's configuration table is checked. Every failure
//! names the variable, so `main` can print one line and exit with code 2.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

/// One setting, as it was declared where it is read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Declared {
    /// The environment variable.
    pub name: String,
    /// Whether the service refuses to start without it.
    pub required: bool,
    /// Its default, as text; `None` when it has none (required, or unset
    /// means "not used").
    pub default: Option<String>,
    /// What it means, in one line.
    pub meaning: String,
}

/// Every setting read so far in this process: what `--help` and
/// `--check-config` report.
static DECLARED: Mutex<BTreeMap<String, Declared>> = Mutex::new(BTreeMap::new());
thread_local! {
    /// Reading for `--help`: as if the environment were empty, required
    /// variables given a placeholder, so every variable is reached. Per
    /// thread, so a description never changes what another thread reads.
    static DESCRIBING: Cell<bool> = const { Cell::new(false) };
}

/// A setting: its environment variable and what it means. Declared once,
/// where it is read (a setting several services share is declared in the
/// crate they share, e.g. [`database_url`]); the meaning is one line of
/// plain text (no `|`: it is a cell of the reference table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    name: &'static str,
    meaning: &'static str,
    shown_default: Option<&'static str>,
}

/// The setting `name`, meaning `meaning`: read it with [`Var::required`],
/// [`Var::optional`], [`Var::parsed`] or [`Var::duration`].
pub const fn var(name: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        meaning,
        shown_default: None,
    }
}

impl Var {
    /// The same setting, its default shown as `text`: for a default that
    /// depends on other settings or the host ("twice ACCOUNT_RATE_LIMIT",
    /// "one per core"), or one applied by a parser of the service's own.
    pub const fn default_shown_as(self, text: &'static str) -> Var {
        Var {
            shown_default: Some(text),
            ..self
        }
    }

    /// The variable's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// What the setting means.
    pub const fn meaning(&self) -> &'static str {
        self.meaning
    }

    /// The default as shown, when set with [`Var::default_shown_as`].
    pub const fn shown_default(&self) -> Option<&'static str> {
        self.shown_default
    }

    /// A required variable.
    pub fn required(&self) -> Result<String, ConfigError> {
        self.declare(true, None);
        if DESCRIBING.get() {
            return Ok(placeholder(self.name));
        }
        self.raw()?
            .ok_or_else(|| ConfigError::new(self.name, "is required but not set"))
    }

    /// An optional variable (`None` when unset or empty).
    pub fn optional(&self) -> Result<Option<String>, ConfigError> {
        self.declare(false, None);
        self.raw()
    }

    /// A parsed variable with a default.
    pub fn parsed<T>(&self, default: T) -> Result<T, ConfigError>
    where
        T: FromStr + Display,
        T::Err: Display,
    {
        self.declare(false, Some(default.to_string()));
        match self.raw()? {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|e| ConfigError::new(self.name, format!("cannot parse {v:?}: {e}"))),
        }
    }

    /// [`Var::parsed`], which must also lie in `range`: otherwise the error
    /// says "must be between" its ends.
    pub fn in_range<T>(&self, default: T, range: RangeInclusive<T>) -> Result<T, ConfigError>
    where
        T: FromStr + Display + PartialOrd,
        T::Err: Display,
    {
        let value = self.parsed(default)?;
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(ConfigError::new(
                self.name,
                format!("must be between {} and {}", range.start(), range.end()),
            ))
        }
    }

    /// A two-way choice (`None` when unset): `Some(true)` for a word of
    /// `yes`, `Some(false)` for a word of `no` (any case); anything else is
    /// an error that names the first word of each.
    pub fn either(&self, yes: &[&str], no: &[&str]) -> Result<Option<bool>, ConfigError> {
        let Some(value) = self.optional()? else {
            return Ok(None);
        };
        let v = value.trim();
        let among = |words: &[&str]| words.iter().any(|w| v.eq_ignore_ascii_case(w));
        if among(yes) {
            Ok(Some(true))
        } else if among(no) {
            Ok(Some(false))
        } else {
            Err(ConfigError::new(
                self.name,
                format!(
                    "{v:?} is neither {} nor {}",
                    yes.first().unwrap_or(&"yes"),
                    no.first().unwrap_or(&"no")
                ),
            ))
        }
    }

    /// A humantime duration (`15m`, `200ms`) with a default.
    pub fn duration(&self, default: Duration) -> Result<Duration, ConfigError> {
        self.declare(false, Some(humantime::format_duration(default).to_string()));
        match self.raw()? {
            None => Ok(default),
            Some(v) => humantime::parse_duration(v.trim()).map_err(|e| {
                ConfigError::new(
                    self.name,
                    format!("cannot parse {v:?} as a duration like 15m or 200ms: {e}"),
                )
            }),
        }
    }

    fn declare(&self, required: bool, default: Option<String>) {
        let default = self.shown_default.map(str::to_owned).or(default);
        if let Ok(mut declared) = DECLARED.lock() {
            declared
                .entry(self.name.to_owned())
                .and_modify(|d| d.required |= required)
                .or_insert_with(|| Declared {
                    name: self.name.to_owned(),
                    required,
                    default,
                    meaning: self.meaning.to_owned(),
                });
        }
    }

    fn raw(&self) -> Result<Option<String>, ConfigError> {
        if DESCRIBING.get() {
            return Ok(None);
        }
        match std::env::var(self.name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(ConfigError::new(self.name, "is not valid UTF-8"))
            }
        }
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

/// How far a signed webhook's timestamp may be from our clock. Webhook
/// receipts (the replay fence) must be kept longer than this.
pub const WEBHOOK_TOLERANCE: Duration = Duration::from_secs(300);

/// `WEBHOOK_SECRET`, shared by the PSP (psp-sim signs with it) and checkout
/// (which verifies); each parses it its own way.
pub const WEBHOOK_SECRET: Var = var(
    "WEBHOOK_SECRET",
    "the PSP webhooks' signing secret, whsec_<base64>: psp-sim signs with it, checkout verifies (several, space-separated, during a rotation)",
);

/// `DATABASE_URL`: a PostgreSQL URL (`postgres://…`), required.
pub fn database_url() -> Result<String, ConfigError> {
    let url = var(
        "DATABASE_URL",
        "PostgreSQL, postgres://user@host/db; several hosts as host1:5432,host2:5432 with target_session_attrs=read-write; TLS by libpq's sslmode and sslrootcert",
    )
    .required()?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConfigError::new(
            "DATABASE_URL",
            "must start with postgres:// or postgresql://",
        ));
    }
    Ok(url)
}

/// `NATS_URL`: the NATS JetStream server, required.
pub fn nats_url() -> Result<String, ConfigError> {
    var(
        "NATS_URL",
        "NATS with JetStream, nats://host:4222 (several, comma-separated, for a cluster)",
    )
    .required()
}

/// `PSP_URL`: the payment provider's base URL (`http://` or `https://`), required.
pub fn psp_url() -> Result<String, ConfigError> {
    let url = var(
        "PSP_URL",
        "the payment provider's base URL, http:// or https://",
    )
    .required()?;
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(ConfigError::new(
            "PSP_URL",
            "must be an http:// or https:// URL",
        ));
    }
    Ok(url)
}

/// `SSL_CERT_FILE`, when set: a PEM file of the certificates an https
/// client trusts (with Mozilla's roots; it replaces the platform's store,
/// as every rustls and OpenSSL client reads it). Read now, so a missing or
/// empty file is one line at start instead of a failure on every call.
pub fn ssl_cert_file() -> Result<Option<String>, ConfigError> {
    let Some(path) = var(
        "SSL_CERT_FILE",
        "a PEM file of certificates an https:// PSP (or webhook target) is checked against, besides Mozilla's roots; read at start",
    )
    .default_shown_as("platform roots")
    .optional()?
    else {
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

/// Every setting `read` reaches, read as if the environment were empty
/// (required ones given a placeholder), and whether it ran to its end
/// (`false`: some settings are read only once others are set).
pub fn describe<T>(read: impl FnOnce() -> Result<T, ConfigError>) -> (Vec<Declared>, bool) {
    DESCRIBING.set(true);
    let complete = read().is_ok();
    DESCRIBING.set(false);
    (declared(), complete)
}

/// Every setting read so far in this process, by name.
fn declared() -> Vec<Declared> {
    DECLARED
        .lock()
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default()
}

/// `--version` and `--help`, answered before anything starts: the version,
/// or a usage with every setting `read` reaches (see [`describe`]): its
/// name, required or its default, and its meaning. `None` when neither was
/// asked for.
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
    let (settings, complete) = describe(read);
    let how = |d: &Declared| match (d.required, &d.default) {
        (true, _) => "required".to_owned(),
        (false, Some(default)) => format!("default {default}"),
        (false, None) => "optional".to_owned(),
    };
    let name_width = settings.iter().map(|d| d.name.len()).max().unwrap_or(0);
    let how_width = settings.iter().map(|d| how(d).len()).max().unwrap_or(0);
    let mut text = format!(
        "{binary} {version}: {about}\n\nUsage: {binary} [--check-config | --help | --version]\n  \
         --check-config  print whether the settings are valid, every variable read and every setting, as JSON; exit 0 or 2\n\n\
         Settings, from the environment (name, default, meaning):\n"
    );
    for d in &settings {
        text.push_str(&format!(
            "  {:<name_width$}  {:<how_width$}  {}\n",
            d.name,
            how(d),
            d.meaning
        ));
    }
    if !complete {
        text.push_str("  (and more, read once these are set)\n");
    }
    Some(text)
}

/// Loads a service's settings. With `--check-config` it prints, as JSON,
/// whether they are valid, every variable the service read (`true` when
/// required) and every setting it declares (as `--help` lists them), then
/// exits (0 if valid, 2 if not). Otherwise an invalid setting prints one
/// line and exits with code 2.
pub fn load<T>(read: impl Fn() -> Result<T, ConfigError>) -> T {
    if !std::env::args().skip(1).any(|a| a == "--check-config") {
        return exit_on_error(read());
    }
    let (settings, _) = describe(&read);
    // Only what the real read reaches counts as read.
    if let Ok(mut declared) = DECLARED.lock() {
        declared.clear();
    }
    let result = read();
    let reads: BTreeMap<String, bool> = declared()
        .into_iter()
        .map(|d| (d.name, d.required))
        .collect();
    let error = result.as_ref().err().map(ToString::to_string);
    println!(
        "{}",
        serde_json::json!({
            "valid": error.is_none(),
            "error": error,
            "reads": reads,
            "settings": settings,
        })
    );
    std::process::exit(if error.is_none() { 0 } else { 2 });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_described_read_declares_each_setting_with_its_default_and_meaning() {
        let (settings, complete) = describe(|| {
            var("TEST_CONFIG_SIZE", "how many").parsed(7u32)?;
            var("TEST_CONFIG_WAIT", "how long").duration(Duration::from_millis(1500))?;
            var("TEST_CONFIG_KEY", "the key").required()?;
            var("TEST_CONFIG_BURST", "a burst")
                .default_shown_as("twice the size")
                .parsed(14u32)
        });
        assert!(complete);
        let find = |name: &str| {
            settings
                .iter()
                .find(|d| d.name == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} in {settings:?}"))
        };
        assert_eq!(find("TEST_CONFIG_SIZE").default.as_deref(), Some("7"));
        assert_eq!(
            find("TEST_CONFIG_WAIT").default.as_deref(),
            Some("1s 500ms")
        );
        assert_eq!(find("TEST_CONFIG_WAIT").meaning, "how long");
        assert!(find("TEST_CONFIG_KEY").required);
        assert_eq!(
            find("TEST_CONFIG_BURST").default.as_deref(),
            Some("twice the size")
        );
    }
}
