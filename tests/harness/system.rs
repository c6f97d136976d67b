//! The whole system as real processes — every service binary on its own
//! free port over a fresh database and a private NATS — so tests can send
//! signals, scrape metrics and check configuration as an operator would.

use crate::app::{TestApp, WEBHOOK_SECRET};
use crate::relay::binary;
use localservers::{free_port, Nats};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The service binaries, in start order.
pub const SERVICES: &[&str] = &[
    "psp-sim",
    "checkout",
    "outbox-relay",
    "payment-worker",
    "expiry",
    "fulfillment",
];

/// A running system of processes.
pub struct System {
    pub app: TestApp,
    pub nats: Nats,
    pub env: BTreeMap<&'static str, BTreeMap<&'static str, String>>,
    pub ports: BTreeMap<&'static str, u16>,
    children: BTreeMap<&'static str, Child>,
    /// Where psp-sim keeps its books (so it can be killed and restarted) and
    /// the services write their logs.
    dir: std::path::PathBuf,
    _temp: Option<tempfile::TempDir>,
}

/// How a [`System`] starts.
#[derive(Debug, Default)]
pub struct SystemOptions {
    /// A migrated database to run on (default: a fresh one on the shared server).
    pub database_url: Option<String>,
    /// Where psp-sim's books and the services' logs go (default: a temporary folder).
    pub dir: Option<std::path::PathBuf>,
    /// Extra settings per service, over the defaults.
    pub env: Vec<(&'static str, &'static str, String)>,
}

impl System {
    /// Starts every service as a process; the test's own in-process
    /// checkout (`app`) is only used for its database helpers.
    pub async fn start() -> System {
        System::start_with(SystemOptions::default()).await
    }

    /// Starts every service as a process, as `options` say.
    pub async fn start_with(options: SystemOptions) -> System {
        let app = match options.database_url {
            Some(url) => TestApp::spawn_on(url, Duration::from_secs(900)).await,
            None => TestApp::spawn().await,
        };
        let nats = Nats::start_temporary().expect("private nats");
        let mut ports = BTreeMap::new();
        for s in SERVICES {
            ports.insert(*s, free_port().expect("port"));
        }
        let addr = |s: &str| format!("127.0.0.1:{}", ports[s]);
        let db = app.database_url.clone();
        let mut env: BTreeMap<&'static str, BTreeMap<&'static str, String>> = BTreeMap::new();
        let (dir, temp) = match options.dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::tempdir().expect("psp-sim data dir");
                (temp.path().to_owned(), Some(temp))
            }
        };
        env.insert(
            "psp-sim",
            BTreeMap::from([
                ("PSP_SIM_ADDR", addr("psp-sim")),
                (
                    "PSP_SIM_DATA_DIR",
                    dir.join("psp-books").display().to_string(),
                ),
                (
                    "PSP_WEBHOOK_URL",
                    format!("http://{}/v1/psp/webhooks", addr("checkout")),
                ),
                ("WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
            ]),
        );
        env.insert(
            "checkout",
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("CHECKOUT_ADDR", addr("checkout")),
                ("WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
            ]),
        );
        env.insert(
            "outbox-relay",
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("NATS_URL", nats.url()),
                ("OUTBOX_RELAY_ADDR", addr("outbox-relay")),
                ("OUTBOX_POLL_INTERVAL", "200ms".to_owned()),
            ]),
        );
        env.insert(
            "payment-worker",
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("NATS_URL", nats.url()),
                ("PSP_URL", format!("http://{}", addr("psp-sim"))),
                ("PAYMENT_WORKER_ADDR", addr("payment-worker")),
            ]),
        );
        env.insert(
            "expiry",
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("EXPIRY_ADDR", addr("expiry")),
                ("EXPIRY_INTERVAL", "100ms".to_owned()),
            ]),
        );
        env.insert(
            "fulfillment",
            BTreeMap::from([
                ("DATABASE_URL", db),
                ("NATS_URL", nats.url()),
                ("FULFILLMENT_ADDR", addr("fulfillment")),
                ("FULFILLMENT_STEP_DELAY", "20ms".to_owned()),
            ]),
        );
        for (service, name, value) in options.env {
            env.get_mut(service)
                .expect("a known service")
                .insert(name, value);
        }
        let mut system = System {
            app,
            nats,
            env,
            ports,
            children: BTreeMap::new(),
            dir,
            _temp: temp,
        };
        for s in SERVICES {
            system.launch(s).await;
        }
        system
    }

    /// The base URL of a service.
    pub fn url(&self, service: &str) -> String {
        format!("http://127.0.0.1:{}", self.ports[service])
    }

    /// Starts one service and waits until it is ready.
    pub async fn launch(&mut self, service: &'static str) {
        let child = Command::new(binary(service))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .envs(&self.env[service])
            .stdout(std::process::Stdio::null())
            .stderr(self.log(service))
            .kill_on_drop(true)
            .spawn()
            .expect("start a service");
        self.children.insert(service, child);
        let probe = if service == "psp-sim" {
            "/healthz"
        } else {
            "/readyz"
        };
        crate::poll::ready(service, &format!("{}{probe}", self.url(service))).await;
    }

    /// Where a service's log goes: a file beside psp-sim's books, appended across restarts.
    fn log(&self, service: &str) -> std::process::Stdio {
        let path = self.dir.join(format!("{service}.log"));
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(file) => file.into(),
            Err(_) => std::process::Stdio::null(),
        }
    }

    /// The folder holding psp-sim's books and every service's log.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The last lines a service logged (for a failing assertion's message).
    pub fn log_tail(&self, service: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{service}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills a service with SIGKILL: no chance to finish anything.
    pub async fn kill(&mut self, service: &'static str) {
        let mut child = self.children.remove(service).expect("running service");
        child.kill().await.expect("SIGKILL");
    }

    /// Sends SIGTERM and returns the exit code once the service has drained.
    pub async fn terminate(&mut self, service: &'static str) -> Option<i32> {
        let mut child = self.children.remove(service).expect("running service");
        let pid = child.id().expect("pid");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("drains within 30 s")
            .expect("wait");
        exit.code()
    }
}
