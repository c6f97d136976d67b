//! `soldonce up`: the whole system on one machine without Docker. It uses
//! DATABASE_URL / NATS_URL when given, otherwise starts private PostgreSQL
//! and NATS servers under `--data-dir`; migrates; seeds a demo product and
//! account; starts the services as child processes with prefixed logs; and
//! stops everything on Ctrl-C. With `--demo` it runs a flash sale and exits.

use crate::children::{spawn_console, spawn_service, stop, wait_ready};
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Args;
use localservers::{Nats, PgOptions, Postgres};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::process::Child;

mod env;
pub(crate) use env::webhook_secret;
use env::{default_env, exports, with_overrides, ConsoleSite, Urls};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where private servers keep their data.
    #[arg(long, default_value = ".soldonce")]
    data_dir: PathBuf,
    /// checkout's listen address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    checkout_addr: String,
    /// Run a flash sale through the running system, print the result and stop.
    #[arg(long)]
    demo: bool,
    /// Buyers in the demo flash sale.
    #[arg(long, default_value_t = 300)]
    buyers: usize,
    /// Units on sale in the demo.
    #[arg(long, default_value_t = 1)]
    stock: i64,
    /// Start only these services (comma-separated), e.g. for a benchmark.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// The services `up` starts, each a binary beside `soldonce`.
const SERVICES: &[&str] = &[
    "psp-sim",
    "checkout",
    "outbox-relay",
    "payment-worker",
    "expiry",
    "fulfillment",
];

pub async fn run(args: UpArgs, out: &Output) -> Result<ExitCode, CliError> {
    if args.buyers == 0 || args.stock < 1 {
        return Err(CliError::Usage(
            "--buyers and --stock must be at least 1".into(),
        ));
    }
    // Refused before anything is created or started.
    check_only(&args.only)?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir).context("resolving --data-dir")?;
    let (database_url, _pg) = given_or_private_postgres(&data_dir)?;
    let (nats_url, _nats) = given_or_private_nats(&data_dir)?;
    let pool = store::connect(&database_url, 4)
        .await
        .context("connecting to PostgreSQL")?;
    store::migrate(&pool).await.context("applying migrations")?;
    let token = seed(&pool).await?;

    let checkout_url = format!("http://{}", args.checkout_addr);
    let psp_addr = format!(
        "127.0.0.1:{}",
        localservers::free_port().context("finding a port for psp-sim")?
    );
    let urls = Urls {
        checkout: checkout_url,
        psp_addr,
        database: database_url,
        nats: nats_url,
    };
    let env = default_env(&urls, &args.checkout_addr, worker_share(&args.only));
    let env = with_overrides(env);
    let (mut children, mut names) = spawn_services(&args.only, &env)?;
    let console = console_to_start(&args.only);
    if let Some(console) = &console {
        let mut console_env = env.clone();
        console_env.push(("CONSOLE_ADDR", console.addr.clone()));
        console_env.push(("CONSOLE_TOKEN", console.token.clone()));
        children.push(spawn_console(&console_env)?);
        names.push("console");
    }
    wait_all_ready(&args.only, &urls, console.as_ref()).await?;
    let env_file = data_dir.join("env");
    write_private(&env_file, &exports(&urls, &token, console.as_ref()))
        .context("writing the env file")?;
    print_banner(
        &urls.checkout,
        &urls.database,
        &urls.nats,
        &token,
        &env_file,
    );

    if args.demo {
        let code =
            crate::demo::flash_sale(&pool, &urls.checkout, &token, args.buyers, args.stock, out)
                .await;
        stop(children).await;
        return code;
    }
    run_until_stopped(children, &names).await
}

/// DATABASE_URL when given, else a private durable PostgreSQL under
/// `data_dir` (kept running while the returned handle lives).
fn given_or_private_postgres(data_dir: &Path) -> Result<(String, Option<Postgres>), CliError> {
    match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => Ok((url, None)),
        None => {
            eprintln!(
                "up: starting PostgreSQL in {}",
                data_dir.join("postgres").display()
            );
            let options = PgOptions {
                durable: true,
                max_connections: 200,
                settings: vec![],
            };
            let pg = Postgres::start_in(&data_dir.join("postgres"), options)
                .context("starting PostgreSQL")?;
            Ok((pg.url("postgres"), Some(pg)))
        }
    }
}

/// NATS_URL when given, else a private nats-server under `data_dir`
/// (kept running while the returned handle lives).
fn given_or_private_nats(data_dir: &Path) -> Result<(String, Option<Nats>), CliError> {
    match std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => Ok((url, None)),
        None => {
            eprintln!(
                "up: starting NATS JetStream in {}",
                data_dir.join("nats").display()
            );
            let nats = Nats::start_in(&data_dir.join("nats")).context("starting nats-server")?;
            Ok((nats.url(), Some(nats)))
        }
    }
}

/// A usage error for a name in `--only` that is neither a service nor the console.
fn check_only(only: &[String]) -> Result<(), CliError> {
    if let Some(unknown) = only
        .iter()
        .find(|s| !SERVICES.contains(&s.as_str()) && s.as_str() != "console")
    {
        return Err(CliError::Usage(format!(
            "--only: unknown service {unknown:?}; known: {}, console",
            SERVICES.join(", ")
        )));
    }
    Ok(())
}

/// Starts the services `--only` leaves in; each child beside its name.
fn spawn_services(
    only: &[String],
    env: &[(&str, String)],
) -> Result<(Vec<Child>, Vec<&'static str>), CliError> {
    let mut children = Vec::new();
    // Each child's name, beside it.
    let mut names: Vec<&'static str> = Vec::new();
    for service in started(only) {
        children.push(spawn_service(service, env)?);
        names.push(service);
    }
    Ok((children, names))
}

/// The console to start, if `--only` wants one and its address is free.
fn console_to_start(only: &[String]) -> Option<ConsoleSite> {
    // The operator console: the soldonce binary itself, on CONSOLE_ADDR
    // (127.0.0.1:8095 unless set), behind a fresh operator token.
    let console_addr = std::env::var("CONSOLE_ADDR")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "127.0.0.1:8095".to_owned());
    let console_token = std::env::var("CONSOLE_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| {
            format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            )
        });
    let console = only.is_empty() || only.iter().any(|s| s == "console");
    // A console whose address is taken is not worth failing the system for.
    if console && std::net::TcpListener::bind(console_addr.as_str()).is_err() {
        eprintln!(
            "up: not starting the console: {console_addr} is taken or invalid (set CONSOLE_ADDR)"
        );
        return None;
    }
    console.then_some(ConsoleSite {
        addr: console_addr,
        token: console_token,
    })
}

/// Waits for psp-sim, the console and checkout (those started) to answer healthy.
async fn wait_all_ready(
    only: &[String],
    urls: &Urls,
    console: Option<&ConsoleSite>,
) -> Result<(), CliError> {
    if only.is_empty() || only.iter().any(|s| s == "psp-sim") {
        wait_ready(&format!("http://{}/healthz", urls.psp_addr)).await?;
    }
    if let Some(ConsoleSite { addr, token }) = console {
        wait_ready(&format!("http://{addr}/healthz")).await?;
        eprintln!("up: console at http://{addr}/#token={token}");
    }
    if only.is_empty() || only.iter().any(|s| s == "checkout") {
        wait_ready(&format!("{}/readyz", urls.checkout)).await?;
    }
    Ok(())
}

/// Runs until Ctrl-C or SIGTERM, or until a child ends; then stops every child.
async fn run_until_stopped(
    mut children: Vec<Child>,
    names: &[&'static str],
) -> Result<ExitCode, CliError> {
    eprintln!("up: running; Ctrl-C stops everything");
    // A child that ends is a fault to see, not one to restart around: up
    // names it and stops the rest (compose restarts its services instead).
    let ended = tokio::select! {
        () = platform::shutdown::signal() => None,
        ended = first_exit(&mut children, names) => Some(ended),
    };
    stop(children).await;
    match ended {
        None => Ok(ExitCode::SUCCESS),
        Some((name, status)) => {
            eprintln!("up: {name} exited ({status}); stopped everything else (its log lines are above, prefixed [{name}])");
            Ok(ExitCode::from(1))
        }
    }
}

/// The first child to end, and how it ended.
async fn first_exit(
    children: &mut [Child],
    names: &[&'static str],
) -> (&'static str, std::process::ExitStatus) {
    loop {
        for (child, name) in children.iter_mut().zip(names) {
            if let Ok(Some(status)) = child.try_wait() {
                return (name, status);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Worker threads for each service's runtime when the operator sets none:
/// the services started here, PostgreSQL and NATS share this machine, so
/// each gets its share of the cores, at least one. A thread per core in
/// every service only adds wake-ups and context switches between them
/// (measured on 2 cores: docs/benchmarks.md, "Worker threads").
fn worker_share(only: &[String]) -> usize {
    (platform::runtime::cores() / (started(only).count() + 2)).max(1)
}

/// The services `up` starts: all, or those `--only` names.
fn started(only: &[String]) -> impl Iterator<Item = &'static str> + '_ {
    SERVICES
        .iter()
        .copied()
        .filter(move |s| only.is_empty() || only.iter().any(|o| o == s))
}

/// The demo product and a fresh demo account; returns the account's token.
async fn seed(pool: &sqlx::PgPool) -> Result<String, CliError> {
    let sku = domain::Sku::parse("DEMO-TSHIRT").context("demo sku")?;
    let currency = "BRL".parse().context("demo currency")?;
    match store::catalog::add_product(pool, &sku, "soldonce T-shirt", 4990, currency).await {
        Ok(()) => {
            store::catalog::receive(pool, &sku, 100)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
        }
        Err(store::catalog::CatalogError::DuplicateSku(_)) => {}
        Err(e) => return Err(anyhow::anyhow!(e).into()),
    }
    let account = store::accounts::create(pool, "demo")
        .await
        .context("creating the demo account")?;
    Ok(account.token)
}

fn print_banner(checkout: &str, db: &str, nats: &str, token: &str, env_file: &Path) {
    eprintln!(
        "\nsoldonce is up\n  checkout   {checkout}  (/healthz /readyz /metrics)\n  postgres   {db}\n  nats       {nats}\n  env        . {}\n\ntry:\n  curl -s -X POST {checkout}/v1/orders -H 'Authorization: Bearer {token}' -H 'Idempotency-Key: demo-1' -H 'Content-Type: application/json' -d '{{\"lines\":[{{\"sku\":\"DEMO-TSHIRT\",\"quantity\":1}}]}}'\n",
        env_file.display()
    );
}

/// Writes a file only its owner can read (it holds a token).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: tighten it too.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(text.as_bytes())
}
