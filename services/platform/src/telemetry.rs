//! Logging on stderr: JSON lines (the default, for log collectors), each
//! naming its `service`, or plain text for a person at a terminal
//! (`LOG_FORMAT=text`, as `soldonce up` runs the services); filtered by
//! `RUST_LOG` (default `info`). Both are settings like any other: a bad
//! value stops the service at start with one line naming it.

use crate::config::{var, ConfigError};
use std::io::IsTerminal as _;
use std::str::FromStr;
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{fmt, EnvFilter};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object a line, with the service's name in `service`.
    Json,
    /// Human-readable lines.
    Text,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            _ => Err("must be text or json".to_owned()),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Json => "json",
            LogFormat::Text => "text",
        })
    }
}

/// The logging settings: `LOG_FORMAT` and `RUST_LOG`.
#[derive(Debug, Clone)]
pub struct Logging {
    pub format: LogFormat,
    /// A tracing filter (`info`, `info,checkout=debug`).
    pub filter: String,
}

impl Logging {
    /// Reads `LOG_FORMAT` and `RUST_LOG`; a filter tracing cannot parse is an error.
    pub fn from_env() -> Result<Logging, ConfigError> {
        let format = var(
            "LOG_FORMAT",
            "json (one object a line on stderr, naming its service) or text (for a terminal; what soldonce up sets)",
        )
        .parsed(LogFormat::Json)?;
        let filter: String = var(
            "RUST_LOG",
            "which log lines are written: a tracing filter such as info or info,checkout=debug",
        )
        .parsed("info".to_owned())?;
        EnvFilter::try_new(&filter)
            .map_err(|e| ConfigError::new("RUST_LOG", format!("cannot parse {filter:?}: {e}")))?;
        Ok(Logging { format, filter })
    }
}

/// Installs the global subscriber for `service`; a second call is a no-op.
pub fn init(service: &'static str, logging: &Logging) {
    let filter = EnvFilter::try_new(&logging.filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let installed = match logging.format {
        LogFormat::Json => fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .map_event_format(|json| WithService::new(service, json))
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init(),
        LogFormat::Text => fmt()
            .with_ansi(std::io::stderr().is_terminal())
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init(),
    };
    if installed.is_ok() {
        tracing::info!(format = %logging.format, "telemetry ready");
    }
}

/// The JSON format, with `"service":"<name>"` first in every line: which
/// service wrote a line stays known once logs are gathered in one place.
struct WithService {
    /// `{"service":"<name>",`, to stand for the line's opening brace.
    opening: String,
    json: Format<Json>,
}

impl WithService {
    fn new(service: &str, json: Format<Json>) -> Self {
        let name = serde_json::Value::from(service);
        WithService {
            opening: format!("{{\"service\":{name},"),
            json,
        }
    }
}

impl<S, N> FormatEvent<S, N> for WithService
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    Format<Json>: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.json.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                writer.write_str(&self.opening)?;
                writer.write_str(rest)
            }
            None => writer.write_str(&line),
        }
    }
}
