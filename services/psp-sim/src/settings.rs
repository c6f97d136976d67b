//! Configuration from the environment, validated at start; every error names its variable.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use platform::config::{self, ConfigError, Var};
use reqwest::Url;

use crate::faults::{Faults, FaultsError};
use crate::ledger::Journal;
use crate::signature::{SecretError, WebhookSecret};

/// Where the simulator listens unless `PSP_SIM_ADDR` says otherwise.
pub const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8090);

/// Everything the simulator needs to start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `PSP_SIM_ADDR`: where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// `PSP_WEBHOOK_URL` + `WEBHOOK_SECRET`: where to send signed webhooks; `None` sends none.
    pub webhook: Option<WebhookTarget>,
    /// `PSP_FAULTS`: the faults in force at start.
    pub faults: Faults,
    /// `PSP_SIM_DATA_DIR`: where the books are journaled and replayed from at start; `None`
    /// keeps them in memory only.
    pub data_dir: Option<PathBuf>,
    /// `PSP_SIM_PUBLIC_URL`: the base of `next_action` URLs (`<base>/v1/payments/{id}/action`);
    /// `None` means `http://` and the bound address.
    pub public_url: Option<Url>,
}

/// A webhook receiver and the secret its webhooks are signed with.
#[derive(Debug, Clone)]
pub struct WebhookTarget {
    /// Plain `http://` URL receiving the POSTs.
    pub url: Url,
    /// Signing secret shared with the receiver.
    pub secret: WebhookSecret,
}

/// A configuration problem, shown as one line starting with the variable's name.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `PSP_SIM_ADDR` is not `host:port`.
    #[error("PSP_SIM_ADDR: {0:?} is not an IP socket address such as 127.0.0.1:8090")]
    Addr(String),
    /// `PSP_WEBHOOK_URL` is not a plain http URL.
    #[error("PSP_WEBHOOK_URL: {value:?} {problem}")]
    WebhookUrl {
        /// The value given.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// `PSP_WEBHOOK_URL` is set but `WEBHOOK_SECRET` is not.
    #[error("WEBHOOK_SECRET: required when PSP_WEBHOOK_URL is set (format whsec_<base64>)")]
    MissingSecret,
    /// `WEBHOOK_SECRET` is malformed.
    #[error("WEBHOOK_SECRET: {0}")]
    Secret(SecretError),
    /// `PSP_FAULTS` is not a valid fault object.
    #[error("PSP_FAULTS: {0}")]
    Faults(FaultsError),
    /// `PSP_SIM_PUBLIC_URL` is not an http(s) URL.
    #[error("PSP_SIM_PUBLIC_URL: {0:?} is not an http:// or https:// URL")]
    PublicUrl(String),
    /// `PSP_SIM_DATA_DIR` is not a directory psp-sim can create and write in.
    #[error("PSP_SIM_DATA_DIR: {value:?} is not a usable directory: {problem}")]
    DataDir {
        /// The value given.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl SettingsError {
    /// The variable at fault.
    pub fn variable(&self) -> &'static str {
        match self {
            SettingsError::Addr(_) => "PSP_SIM_ADDR",
            SettingsError::WebhookUrl { .. } => "PSP_WEBHOOK_URL",
            SettingsError::MissingSecret | SettingsError::Secret(_) => "WEBHOOK_SECRET",
            SettingsError::Faults(_) => "PSP_FAULTS",
            SettingsError::DataDir { .. } => "PSP_SIM_DATA_DIR",
            SettingsError::PublicUrl(_) => "PSP_SIM_PUBLIC_URL",
        }
    }

    /// What is wrong with it: the message after the variable's name.
    pub fn reason(&self) -> String {
        let text = self.to_string();
        let prefix = format!("{}: ", self.variable());
        text.strip_prefix(&prefix).unwrap_or(&text).to_owned()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            addr: DEFAULT_ADDR,
            webhook: None,
            faults: Faults::default(),
            data_dir: None,
            public_url: None,
        }
    }
}

/// Every setting psp-sim reads, each with its meaning (`--help` lists them).
pub const SETTINGS: [Var; 6] = [
    config::var(
        "PSP_SIM_ADDR",
        "where psp-sim's API and /healthz /metrics listen; port 0 picks a free port",
    )
    .default_shown_as("127.0.0.1:8090"),
    config::var(
        "PSP_WEBHOOK_URL",
        "where psp-sim sends its signed webhooks, an http:// URL (unset: it sends none)",
    ),
    config::WEBHOOK_SECRET,
    config::var(
        "PSP_FAULTS",
        "the faults in force at start, as JSON (see proto/psp-sim.openapi.yaml)",
    )
    .default_shown_as("{}"),
    config::var(
        "PSP_SIM_DATA_DIR",
        "keeps psp-sim's books in ledger.jsonl there, so it can be killed and restarted (unset: memory only)",
    ),
    config::var(
        "PSP_SIM_PUBLIC_URL",
        "the base URL buyers reach psp-sim at, for next_action URLs (unset: http:// and the bound address)",
    ),
];

impl Settings {
    /// Reads every variable of [`SETTINGS`].
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut values = Vec::with_capacity(SETTINGS.len());
        for setting in SETTINGS {
            if let Some(value) = setting.optional()? {
                values.push((setting.name(), value));
            }
        }
        Self::from_vars(|wanted| {
            values
                .iter()
                .find(|(name, _)| *name == wanted)
                .map(|(_, value)| value.clone())
        })
        .map_err(|e| ConfigError::new(e.variable(), e.reason()))
    }

    /// Builds settings from any variable lookup; empty values count as unset. A missing
    /// `PSP_SIM_DATA_DIR` is created, and an empty journal in it if there is none.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let get = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let addr = match get("PSP_SIM_ADDR") {
            Some(text) => text
                .trim()
                .parse()
                .map_err(|_| SettingsError::Addr(text.clone()))?,
            None => DEFAULT_ADDR,
        };
        let webhook = match get("PSP_WEBHOOK_URL") {
            Some(url) => {
                let secret = get("WEBHOOK_SECRET").ok_or(SettingsError::MissingSecret)?;
                Some(WebhookTarget {
                    url: parse_webhook_url(url.trim())?,
                    secret: WebhookSecret::parse(secret.trim()).map_err(SettingsError::Secret)?,
                })
            }
            None => None,
        };
        let faults = match get("PSP_FAULTS") {
            Some(json) => Faults::from_json(&json).map_err(SettingsError::Faults)?,
            None => Faults::default(),
        };
        let data_dir = get("PSP_SIM_DATA_DIR")
            .map(|dir| usable_dir(dir.trim()))
            .transpose()?;
        let public_url = get("PSP_SIM_PUBLIC_URL")
            .map(|text| parse_public_url(text.trim()))
            .transpose()?;
        Ok(Self {
            addr,
            webhook,
            faults,
            data_dir,
            public_url,
        })
    }
}

/// The directory, created if missing, once a journal is known to be writable in it.
fn usable_dir(text: &str) -> Result<PathBuf, SettingsError> {
    let refuse = |problem: String| SettingsError::DataDir {
        value: text.to_owned(),
        problem,
    };
    let path = Path::new(text);
    if path.exists() && !path.is_dir() {
        return Err(refuse("it exists and is not a directory".to_owned()));
    }
    std::fs::create_dir_all(path).map_err(|error| refuse(format!("cannot create it: {error}")))?;
    Journal::probe(path).map_err(|error| refuse(format!("cannot write in it: {error}")))?;
    Ok(path.to_path_buf())
}

fn parse_public_url(text: &str) -> Result<Url, SettingsError> {
    match Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Ok(url),
        _ => Err(SettingsError::PublicUrl(text.to_owned())),
    }
}

fn parse_webhook_url(text: &str) -> Result<Url, SettingsError> {
    let refuse = |problem| SettingsError::WebhookUrl {
        value: text.to_owned(),
        problem,
    };
    let url = Url::parse(text).map_err(|_| refuse("is not a URL"))?;
    match url.scheme() {
        "http" => Ok(url),
        "https" => Err(refuse("uses https, which this build cannot send; use http")),
        _ => Err(refuse("is not an http URL")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        Settings::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn nothing_set_means_the_defaults() {
        let settings = settings(&[]).unwrap();
        assert_eq!(settings.addr, DEFAULT_ADDR);
        assert!(settings.webhook.is_none());
        assert_eq!(settings.faults, Faults::default());
        assert_eq!(settings.data_dir, None);
        assert_eq!(settings.public_url, None);
        assert_eq!(
            Some(DEFAULT_ADDR.to_string().as_str()),
            SETTINGS[0].shown_default(),
            "--help shows the default in force"
        );
    }

    #[test]
    fn a_missing_data_dir_is_created() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("books").join("psp");
        let settings = settings(&[("PSP_SIM_DATA_DIR", dir.to_str().unwrap())]).unwrap();
        assert_eq!(settings.data_dir.as_deref(), Some(dir.as_path()));
        assert!(dir.join("ledger.jsonl").is_file());
    }

    #[test]
    fn a_data_dir_that_is_a_file_is_one_line_naming_the_variable() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = settings(&[("PSP_SIM_DATA_DIR", file.path().to_str().unwrap())])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("PSP_SIM_DATA_DIR: "), "{error}");
        assert!(error.ends_with("is not a usable directory: it exists and is not a directory"));
        assert_eq!(error.lines().count(), 1);
    }

    #[test]
    fn port_zero_and_a_webhook_target_are_accepted() {
        let settings = settings(&[
            ("PSP_SIM_ADDR", "127.0.0.1:0"),
            ("PSP_WEBHOOK_URL", "http://127.0.0.1:8080/v1/psp/webhooks"),
            ("WEBHOOK_SECRET", SECRET),
            ("PSP_FAULTS", r#"{"decline_rate": 0.25}"#),
        ])
        .unwrap();
        assert_eq!(settings.addr.port(), 0);
        assert!(settings.webhook.is_some());
        assert_eq!(settings.faults.decline_rate, 0.25);
    }

    #[test]
    fn each_error_starts_with_the_variable_name() {
        let message = |vars: &[(&str, &str)]| settings(vars).unwrap_err().to_string();
        assert!(message(&[("PSP_SIM_ADDR", "nowhere")]).starts_with("PSP_SIM_ADDR: "));
        assert!(message(&[("PSP_WEBHOOK_URL", "http://x")]).starts_with("WEBHOOK_SECRET: "));
        assert!(
            message(&[("PSP_WEBHOOK_URL", "x"), ("WEBHOOK_SECRET", SECRET)])
                .starts_with("PSP_WEBHOOK_URL: ")
        );
        assert!(
            message(&[("PSP_WEBHOOK_URL", "http://x"), ("WEBHOOK_SECRET", "s")])
                .starts_with("WEBHOOK_SECRET: ")
        );
        assert_eq!(
            message(&[("PSP_FAULTS", r#"{"chaos": 1}"#)]),
            "PSP_FAULTS: chaos: unknown field"
        );
        assert!(message(&[("PSP_SIM_PUBLIC_URL", "ftp://x")]).starts_with("PSP_SIM_PUBLIC_URL: "));
        let public = settings(&[("PSP_SIM_PUBLIC_URL", "https://psp.example/")]).unwrap();
        assert_eq!(
            public.public_url.map(String::from).as_deref(),
            Some("https://psp.example/")
        );
    }
}
