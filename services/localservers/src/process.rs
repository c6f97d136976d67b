//! Running a server under a watchdog shell: the shell starts the server,
//! then waits on its stdin, which is a pipe from this process. Whether this
//! process drops the handle or dies, the pipe closes and the shell stops the
//! server, so no server outlives its owner. A line written to the pipe names
//! another signal to stop it with (a crash instead of a clean stop).

use crate::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server under its watchdog.
pub(crate) struct Watched {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watched {
    /// Starts `argv` (run as `user` when given) with its output appended to `log`.
    pub(crate) fn spawn(
        argv: &[String],
        user: Option<&str>,
        log: &Path,
        stop_signal: &str,
    ) -> Result<Self, Error> {
        let quoted: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
        let script = format!(
            "{cmd} >>{log} 2>&1 </dev/null & pid=$!; read sig; kill -${{sig:-{sig}}} $pid 2>/dev/null; wait $pid",
            cmd = quoted.join(" "),
            log = shell_quote(&log.to_string_lossy()),
            sig = stop_signal,
        );
        let mut command = match user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--", "sh", "-c", &script]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.args(["-c", &script]);
                c
            }
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Watched { child, stdin })
    }

    /// Stops the server and waits for it to exit.
    pub(crate) fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }

    /// Stops the server with `signal` (such as `KILL`) and waits for it to exit.
    pub(crate) fn stop_with(&mut self, signal: &str) {
        use std::io::Write;
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "{signal}");
        }
        let _ = self.child.wait();
    }

    /// Whether the watchdog (and so the server) has exited.
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Finds `binary` on PATH.
pub(crate) fn which(binary: &'static str, hint: &'static str) -> Result<PathBuf, Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
        .ok_or(Error::Missing { binary, hint })
}

/// Polls until a TCP connection to the port succeeds.
pub(crate) fn wait_for_port(
    port: u16,
    within: Duration,
    watched: &mut Watched,
    what: &str,
    log: &Path,
) -> Result<(), Error> {
    let deadline = Instant::now() + within;
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if watched.exited() || Instant::now() > deadline {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = tail
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" | ");
            return Err(Error::Failed {
                what: format!("starting {what}"),
                detail: tail,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion, returning its stdout.
pub(crate) fn run(mut command: Command, what: &str) -> Result<String, Error> {
    let out = command.output()?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.to_owned(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
