//! Reading configuration from the environment. Every failure names the
//! variable, so `main` can print one line and exit with code 2.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

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
        ConfigError { name: name.to_owned(), reason: reason.to_string() }
    }
}

fn raw(name: &str) -> Result<Option<String>, ConfigError> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::new(name, "is not valid UTF-8")),
    }
}

/// A required variable.
pub fn required(name: &str) -> Result<String, ConfigError> {
    raw(name)?.ok_or_else(|| ConfigError::new(name, "is required but not set"))
}

/// An optional variable.
pub fn optional(name: &str) -> Result<Option<String>, ConfigError> {
    raw(name)
}

/// A parsed variable with a default.
pub fn parsed<T>(name: &str, default: T) -> Result<T, ConfigError>
where
    T: FromStr,
    T::Err: Display,
{
    match raw(name)? {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e| ConfigError::new(name, format!("cannot parse {v:?}: {e}"))),
    }
}

/// A humantime duration (`15m`, `200ms`) with a default.
pub fn duration(name: &str, default: Duration) -> Result<Duration, ConfigError> {
    match raw(name)? {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v.trim())
            .map_err(|e| ConfigError::new(name, format!("cannot parse {v:?} as a duration like 15m or 200ms: {e}"))),
    }
}

/// A PostgreSQL URL (`postgres://…`).
pub fn database_url() -> Result<String, ConfigError> {
    let url = required("DATABASE_URL")?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConfigError::new("DATABASE_URL", "must start with postgres:// or postgresql://"));
    }
    Ok(url)
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
