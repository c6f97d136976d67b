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
    /// Each instance's settings, by instance name: the service's name for
    /// the first, `service#2`, `service#3`, … for more.
    pub env: BTreeMap<String, BTreeMap<&'static str, String>>,
    pub ports: BTreeMap<String, u16>,
    /// Every instance, in start order.
    pub instances: Vec<String>,
    children: BTreeMap<String, Child>,
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
    /// How many instances of a service to run, when more than one.
    pub instances: Vec<(&'static str, usize)>,
    /// A NATS JetStream cluster of this many servers (stream replicas the
    /// same) instead of one server.
    pub nats_cluster: Option<usize>,
    /// Services to start on a port chosen beforehand (e.g. behind a proxy
    /// started first), instead of a free one picked at start.
    pub ports: Vec<(&'static str, u16)>,
}

/// The variable a service's HTTP address is read from.
/// A free port that no instance of the system was given: the OS may hand
/// out a port again once its picker has closed it, and two services named
/// on one port would each be moved as one (their settings rewritten
/// together), leaving one polled where nothing listens.
fn unused_port(given: &BTreeMap<String, u16>) -> u16 {
    loop {
        let port = free_port().expect("port");
        if !given.values().any(|&p| p == port) {
            return port;
        }
    }
}

fn addr_variable(service: &str) -> &'static str {
    match service {
        "psp-sim" => "PSP_SIM_ADDR",
        "checkout" => "CHECKOUT_ADDR",
        "outbox-relay" => "OUTBOX_RELAY_ADDR",
        "payment-worker" => "PAYMENT_WORKER_ADDR",
        "expiry" => "EXPIRY_ADDR",
        "fulfillment" => "FULFILLMENT_ADDR",
        other => panic!("no such service: {other}"),
    }
}

/// The service an instance name belongs to.
fn service_of(instance: &str) -> &str {
    instance.split('#').next().unwrap_or(instance)
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
        let nats = match options.nats_cluster {
            Some(size) => {
                let nats = Nats::start_cluster_temporary(size).expect("private nats cluster");
                create_stream(&nats.url(), size).await;
                nats
            }
            None => Nats::start_temporary().expect("private nats"),
        };
        let mut ports: BTreeMap<String, u16> = BTreeMap::new();
        for s in SERVICES {
            let port = unused_port(&ports);
            ports.insert((*s).to_owned(), port);
        }
        for (service, port) in &options.ports {
            ports.insert((*service).to_owned(), *port);
        }
        let addr = |s: &str| format!("127.0.0.1:{}", ports[s]);
        let db = app.database_url.clone();
        let mut env: BTreeMap<String, BTreeMap<&'static str, String>> = BTreeMap::new();
        let (dir, temp) = match options.dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::tempdir().expect("psp-sim data dir");
                (temp.path().to_owned(), Some(temp))
            }
        };
        env.insert(
            "psp-sim".to_owned(),
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
            "checkout".to_owned(),
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("CHECKOUT_ADDR", addr("checkout")),
                ("WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
            ]),
        );
        env.insert(
            "outbox-relay".to_owned(),
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("NATS_URL", nats.url()),
                ("OUTBOX_RELAY_ADDR", addr("outbox-relay")),
                ("OUTBOX_POLL_INTERVAL", "200ms".to_owned()),
            ]),
        );
        env.insert(
            "payment-worker".to_owned(),
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("NATS_URL", nats.url()),
                ("PSP_URL", format!("http://{}", addr("psp-sim"))),
                ("PAYMENT_WORKER_ADDR", addr("payment-worker")),
            ]),
        );
        env.insert(
            "expiry".to_owned(),
            BTreeMap::from([
                ("DATABASE_URL", db.clone()),
                ("EXPIRY_ADDR", addr("expiry")),
                ("EXPIRY_INTERVAL", "100ms".to_owned()),
            ]),
        );
        env.insert(
            "fulfillment".to_owned(),
            BTreeMap::from([
                ("DATABASE_URL", db),
                ("NATS_URL", nats.url()),
                ("FULFILLMENT_ADDR", addr("fulfillment")),
                ("FULFILLMENT_STEP_DELAY", "20ms".to_owned()),
            ]),
        );
        // Every service shares this host with the servers, as with `soldonce
        // up` and the compose file: one runtime thread each, as they run them.
        for settings in env.values_mut() {
            settings.insert("TOKIO_WORKER_THREADS", "1".to_owned());
        }
        if let Some(size) = options.nats_cluster {
            for service in ["outbox-relay", "payment-worker", "fulfillment"] {
                env.get_mut(service)
                    .expect("a known service")
                    .insert("STREAM_REPLICAS", size.to_string());
            }
        }
        for (service, name, value) in options.env {
            env.get_mut(service)
                .expect("a known service")
                .insert(name, value);
        }
        let mut instances: Vec<String> = SERVICES.iter().map(|s| (*s).to_owned()).collect();
        for (service, count) in options.instances {
            for k in 2..=count {
                let name = format!("{service}#{k}");
                let port = unused_port(&ports);
                let mut settings = env[service].clone();
                settings.insert(addr_variable(service), format!("127.0.0.1:{port}"));
                env.insert(name.clone(), settings);
                ports.insert(name.clone(), port);
                instances.push(name);
            }
        }
        let mut system = System {
            app,
            nats,
            env,
            ports,
            instances: instances.clone(),
            children: BTreeMap::new(),
            dir,
            _temp: temp,
        };
        for instance in &instances {
            system.launch(instance).await;
        }
        system
    }

    /// The base URL of a service.
    /// Places one unit of `sku` through checkout instance `instance` with
    /// `token` and Idempotency-Key `key`; the reply.
    pub async fn place(
        &self,
        instance: &str,
        token: &str,
        key: &str,
        sku: &str,
    ) -> crate::app::Reply {
        let body = serde_json::json!({ "lines": [{ "sku": sku, "quantity": 1 }] });
        self.app
            .send(
                self.app
                    .client
                    .post(format!("{}/v1/orders", self.url(instance)))
                    .bearer_auth(token)
                    .header("idempotency-key", key)
                    .json(&body),
            )
            .await
    }

    pub fn url(&self, service: &str) -> String {
        format!("http://127.0.0.1:{}", self.ports[service])
    }

    /// Starts one service and waits until it is ready. Its port was free
    /// when it was picked, but another process (another test's server, or
    /// any outgoing connection's local port) may take it before the service
    /// binds it: a service that exits saying so gets a new port, the other
    /// services' settings follow, and those already running that named the
    /// old port are restarted with the new one.
    pub async fn launch(&mut self, instance: &str) {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut child = self.spawn(instance);
            let probe = if service_of(instance) == "psp-sim" {
                "/healthz"
            } else {
                "/readyz"
            };
            let url = format!("{}{probe}", self.url(instance));
            if crate::poll::ready_unless_exited(instance, &url, &mut child).await {
                self.children.insert(instance.to_owned(), child);
                return;
            }
            let taken = self.log_tail(instance).contains("Address already in use");
            assert!(
                taken && attempt < ATTEMPTS,
                "{instance} exited before it was ready:\n{}",
                self.log_tail(instance)
            );
            Box::pin(self.move_port(instance)).await;
        }
    }

    fn spawn(&self, instance: &str) -> Child {
        Command::new(binary(service_of(instance)))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .envs(&self.env[instance])
            .stdout(std::process::Stdio::null())
            .stderr(self.log(instance))
            .kill_on_drop(true)
            .spawn()
            .expect("start a service")
    }

    /// Gives `instance` a new port, in its own settings and in every other
    /// instance's, and restarts the running instances that named the old one.
    async fn move_port(&mut self, instance: &str) {
        let old = format!("127.0.0.1:{}", self.ports[instance]);
        let port = unused_port(&self.ports);
        let new = format!("127.0.0.1:{port}");
        self.ports.insert(instance.to_owned(), port);
        let mut restart = Vec::new();
        for (name, settings) in &mut self.env {
            for value in settings.values_mut() {
                if value.contains(&old) {
                    *value = value.replace(&old, &new);
                    if name != instance && self.children.contains_key(name) {
                        restart.push(name.clone());
                    }
                }
            }
        }
        restart.dedup();
        for name in restart {
            self.kill(&name).await;
            self.launch(&name).await;
        }
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

    /// The instances that ended on their own since the last look (not by
    /// [`System::kill`] or [`System::terminate`]), each with how it ended.
    /// They are no longer counted as running: [`System::launch`] starts
    /// one again, as its supervisor would.
    pub fn exited(&mut self) -> Vec<(String, std::process::ExitStatus)> {
        let gone: Vec<(String, std::process::ExitStatus)> = self
            .children
            .iter_mut()
            .filter_map(|(name, child)| {
                child
                    .try_wait()
                    .ok()
                    .flatten()
                    .map(|status| (name.clone(), status))
            })
            .collect();
        for (name, _) in &gone {
            self.children.remove(name);
        }
        gone
    }

    /// Kills a service with SIGKILL: no chance to finish anything.
    pub async fn kill(&mut self, instance: &str) {
        let mut child = self.children.remove(instance).expect("running service");
        child.kill().await.expect("SIGKILL");
    }

    /// Sends SIGTERM and returns the exit code once the service has drained.
    pub async fn terminate(&mut self, instance: &str) -> Option<i32> {
        let mut child = self.children.remove(instance).expect("running service");
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

/// Creates the stream with `replicas` replicas once the cluster has formed
/// (JetStream answers only when its servers have elected a leader).
async fn create_stream(nats_url: &str, replicas: usize) {
    let settings = bus::StreamSettings {
        replicas,
        ..bus::StreamSettings::default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let js = bus::connect(nats_url).await.expect("nats cluster");
    loop {
        match bus::ensure_stream(&js, &settings).await {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the NATS cluster formed no JetStream within 60 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}
