//! A private PostgreSQL cluster: `initdb` into a directory, `postgres` on a
//! free port of 127.0.0.1 with its socket in that directory. PostgreSQL
//! refuses to run as root, so under root it runs as the `postgres` user (or
//! `SOLDONCE_PG_USER`).

use crate::process::{self, Started, Watched};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HINT: &str =
    "install PostgreSQL (Debian: apt-get install postgresql) and put its bin directory on PATH";

/// How the cluster is tuned.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Keep fsync on. Tests turn it off: their data is disposable.
    pub durable: bool,
    pub max_connections: u32,
    /// More server settings, each `name=value` (passed as `-c`).
    pub settings: Vec<String>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            durable: false,
            max_connections: 400,
            settings: vec![],
        }
    }
}

/// A running private PostgreSQL server.
pub struct Postgres {
    port: u16,
    dir: PathBuf,
    user: Option<String>,
    options: PgOptions,
    server: Option<Watched>,
    _temp: Option<tempfile::TempDir>,
}

/// The name every temporary server's folder starts with.
const TEMP_PREFIX: &str = "soldonce-pg-";
/// A temporary server's folder this old, whose server is not running, is
/// left over.
const STALE_AFTER: Duration = Duration::from_secs(600);

/// Removes the folders of temporary servers whose server is gone. A server
/// a whole test process shares lives in a static, which is never dropped:
/// its folder (a cluster, often over a gigabyte) stays behind when the
/// process exits, one per test binary run, until the disk is full.
fn sweep_stale_temporaries() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(TEMP_PREFIX));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !(ours && old) {
            continue;
        }
        // A running server's data folder names its postmaster.
        let postmaster = std::fs::read_to_string(path.join("data").join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<u32>().ok());
        let running = postmaster.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !running {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

impl Postgres {
    /// Creates a cluster in a temporary directory and starts it.
    pub fn start_temporary(options: PgOptions) -> Result<Self, Error> {
        sweep_stale_temporaries();
        let temp = tempfile::Builder::new().prefix(TEMP_PREFIX).tempdir()?;
        let mut pg = Postgres::start_in(temp.path(), options)?;
        pg._temp = Some(temp);
        Ok(pg)
    }

    /// Starts the cluster kept in `dir`, creating it on first use.
    pub fn start_in(dir: &Path, options: PgOptions) -> Result<Self, Error> {
        let mut pg = Postgres::prepare(dir, options)?;
        if !pg.data_dir().join("PG_VERSION").exists() {
            pg.initdb()?;
        }
        pg.launch(true)?;
        Ok(pg)
    }

    /// Creates a streaming-replication standby of `primary` in `dir`
    /// (`pg_basebackup`) and starts it; it connects to the primary as
    /// `application_name` = `name`, which the primary's
    /// `synchronous_standby_names` may list to make it synchronous.
    pub fn start_standby_in(
        dir: &Path,
        primary: &Postgres,
        name: &str,
        options: PgOptions,
    ) -> Result<Self, Error> {
        process::which("pg_basebackup", HINT)?;
        let mut options = options;
        options.settings.push(format!(
            "primary_conninfo=host=127.0.0.1 port={} user=postgres application_name={name}",
            primary.port
        ));
        let mut pg = Postgres::prepare(dir, options)?;
        let mut c = pg.command("pg_basebackup");
        c.arg("-D").arg(pg.data_dir()).args([
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "--no-sync",
        ]);
        process::run(c, "pg_basebackup")?;
        pg.launch(true)?;
        Ok(pg)
    }

    fn prepare(dir: &Path, options: PgOptions) -> Result<Self, Error> {
        process::which("initdb", HINT)?;
        process::which("postgres", HINT)?;
        let user = server_user()?;
        std::fs::create_dir_all(dir)?;
        if let Some(u) = &user {
            chown_to(dir, u)?;
        }
        Ok(Postgres {
            port: crate::free_port()?,
            dir: dir.to_owned(),
            user,
            options,
            server: None,
            _temp: None,
        })
    }

    /// Promotes a standby to primary (`pg_ctl promote`, waiting until it
    /// takes writes).
    pub fn promote(&mut self) -> Result<(), Error> {
        process::which("pg_ctl", HINT)?;
        let mut c = self.command("pg_ctl");
        c.arg("promote")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60"]);
        process::run(c, "pg_ctl promote").map(|_| ())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn initdb(&self) -> Result<(), Error> {
        let mut c = self.command("initdb");
        c.arg("-D").arg(self.data_dir()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        process::run(c, "initdb").map(|_| ())
    }

    fn command(&self, binary: &str) -> Command {
        match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--", binary]);
                c
            }
            None => Command::new(binary),
        }
    }

    /// Starts the server. A port picked as free can be taken before the
    /// server binds it (by another server, or as a connection's local
    /// port): a first start (`may_move`) then tries a new port; a restart,
    /// whose clients know its port, waits for the port to be released.
    fn launch(&mut self, may_move: bool) -> Result<(), Error> {
        let mut attempts = 0;
        loop {
            match self.launch_once()? {
                Started::Ready => return Ok(()),
                Started::PortTaken if attempts < 20 => {
                    attempts += 1;
                    self.server = None;
                    if may_move {
                        self.port = crate::free_port()?;
                    } else {
                        std::thread::sleep(Duration::from_millis(250));
                    }
                }
                Started::PortTaken => {
                    return Err(Error::Failed {
                        what: "starting postgres".into(),
                        detail: format!("port {} stayed taken", self.port),
                    })
                }
            }
        }
    }

    fn launch_once(&mut self) -> Result<Started, Error> {
        let durable = if self.options.durable { "on" } else { "off" };
        let argv: Vec<String> = vec![
            "postgres".into(),
            "-D".into(),
            self.data_dir().to_string_lossy().into_owned(),
            "-p".into(),
            self.port.to_string(),
            "-k".into(),
            self.dir.to_string_lossy().into_owned(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            format!("max_connections={}", self.options.max_connections),
            "-c".into(),
            format!("fsync={durable}"),
            "-c".into(),
            format!("full_page_writes={durable}"),
            "-c".into(),
            format!("synchronous_commit={durable}"),
            "-c".into(),
            "shared_buffers=256MB".into(),
            // Commit times, so the relay measures commit → PubAck exactly.
            "-c".into(),
            "track_commit_timestamp=on".into(),
        ];
        let argv: Vec<String> = argv
            .into_iter()
            .chain(
                self.options
                    .settings
                    .iter()
                    .flat_map(|s| ["-c".to_owned(), s.clone()]),
            )
            .collect();
        let log = self.log();
        // Readiness is read from what this start adds to the log.
        let offset = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        self.server = Some(Watched::spawn(&argv, self.user.as_deref(), &log, "INT")?);
        self.wait_until_accepting(offset)
    }

    /// The server accepts TCP before it accepts queries: wait until this
    /// start's part of the log says it is ready.
    fn wait_until_accepting(&mut self, offset: usize) -> Result<Started, Error> {
        process::await_start(
            "postgres",
            &self.log(),
            offset,
            Duration::from_secs(60),
            |text| {
                text.contains("database system is ready to accept connections")
                    || text.contains("database system is ready to accept read-only connections")
            },
            "could not create any TCP/IP sockets",
            "database system is shut down",
        )
    }

    /// The server's log; a restart appends to it.
    pub fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for database `db` as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Stops the server (fast shutdown); the data stays.
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }

    /// Crash-stops the server as `pg_ctl -m immediate` does (SIGQUIT: every
    /// backend exits at once, no checkpoint); the next start runs crash recovery.
    pub fn crash(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop_with("QUIT");
        }
    }

    /// Starts a stopped server again on the same port and data.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop();
        self.launch(false)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Who runs the server: ourselves, unless we are root.
fn server_user() -> Result<Option<String>, Error> {
    let uid = process::run(
        {
            let mut c = Command::new("id");
            c.arg("-u");
            c
        },
        "id -u",
    )?;
    if uid.trim() != "0" {
        return Ok(None);
    }
    process::which(
        "runuser",
        "install util-linux (runuser), needed to run PostgreSQL as a non-root user",
    )?;
    let user = std::env::var("SOLDONCE_PG_USER").unwrap_or_else(|_| "postgres".into());
    Ok(Some(user))
}

fn chown_to(dir: &Path, user: &str) -> Result<(), Error> {
    let mut c = Command::new("chown");
    c.arg("-R").arg(format!("{user}:")).arg(dir);
    process::run(c, &format!("chown {user} {}", dir.display()))?;
    // Let the server user reach a directory below a private temp dir.
    let mut p = dir.parent();
    while let Some(parent) = p {
        if parent == std::env::temp_dir() || parent.parent().is_none() {
            break;
        }
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(parent) {
            let mode = meta.permissions().mode();
            if mode & 0o001 == 0 {
                let _ =
                    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode | 0o011));
            }
        }
        p = parent.parent();
    }
    Ok(())
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    fn folder(tag: &str, postmaster: Option<u32>) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("{TEMP_PREFIX}sweep-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).expect("folder");
        if let Some(pid) = postmaster {
            std::fs::write(dir.join("data").join("postmaster.pid"), format!("{pid}\n"))
                .expect("pid file");
        }
        let aged = Command::new("touch")
            .args(["-d", "1 hour ago"])
            .arg(&dir)
            .status()
            .expect("touch");
        assert!(aged.success());
        dir
    }

    #[test]
    fn an_old_folder_whose_server_is_gone_is_removed_and_a_running_ones_is_kept() {
        let gone = folder("gone", Some(u32::MAX));
        let unstarted = folder("unstarted", None);
        let running = folder("running", Some(std::process::id()));
        sweep_stale_temporaries();
        assert!(!gone.exists(), "a dead postmaster's folder is removed");
        assert!(
            !unstarted.exists(),
            "an old folder without a server is removed"
        );
        assert!(running.exists(), "a live server's folder stays");
        std::fs::remove_dir_all(running).expect("clean up");
    }
}
