//! The programs the CLI starts as child processes: soldonce's services,
//! found beside the `soldonce` binary, and the CLI itself (the console).
//! Their output is passed on line by line, prefixed with the program's name.

use crate::CliError;
use anyhow::Context;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A service binary beside this one (`cargo build` puts them together).
pub fn binary_path(name: &str) -> Result<PathBuf, CliError> {
    let exe = std::env::current_exe().context("locating the soldonce binary")?;
    let path = exe
        .parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| PathBuf::from(name));
    if !path.is_file() {
        return Err(anyhow::anyhow!(
            "{} not found beside soldonce; build the workspace (cargo build --release)",
            path.display()
        )
        .into());
    }
    Ok(path)
}

/// Starts the service binary `name` with `env` added to this environment.
pub fn spawn_service(name: &'static str, env: &[(&str, String)]) -> Result<Child, CliError> {
    spawn(name, Command::new(binary_path(name)?), env)
}

/// Starts the program at `path` with `env` added to this environment, its
/// output appended to `log` (a benchmark keeps its terminal for figures).
pub fn spawn_logged(
    path: &std::path::Path,
    env: &[(String, String)],
    log: &std::path::Path,
) -> Result<Child, CliError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = file.try_clone().context("sharing the log file")?;
    Ok(Command::new(path)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", path.display()))?)
}

/// `soldonce console`, this very binary, with its output prefixed like a service's.
pub fn spawn_console(env: &[(&str, String)]) -> Result<Child, CliError> {
    let exe = std::env::current_exe().context("locating the soldonce binary")?;
    let mut command = Command::new(exe);
    command.arg("console");
    spawn("console", command, env)
}

fn spawn(
    name: &'static str,
    mut command: Command,
    env: &[(&str, String)],
) -> Result<Child, CliError> {
    command
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(prefix_lines(name, BufReader::new(stdout)));
    }
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(prefix_lines(name, BufReader::new(stderr)));
    }
    Ok(child)
}

async fn prefix_lines<R: tokio::io::AsyncRead + Unpin>(name: &str, reader: BufReader<R>) {
    let mut lines = reader.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("[{name}] {line}");
    }
}

/// Polls `url` until it answers 2xx, for at most 30 s.
pub async fn wait_ready(url: &str) -> Result<(), CliError> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!("{url} did not become ready within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM to each child, so services drain; a child that lingers past
/// 10 s is killed.
pub async fn stop(children: Vec<Child>) {
    for mut child in children {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}
