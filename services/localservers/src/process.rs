//! Running a server under a watchdog shell: the shell starts the server,
//! then waits on its stdin, which is a pipe from this process. Whether this
//! process drops the handle or dies, the pipe closes and the shell stops the
//! server, so no server outlives its owner. A line written to the pipe names
//! another signal to stop it with (a crash instead of a clean stop).

use crate::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

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
