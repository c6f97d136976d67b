//! `soldonce up`: the whole system on one machine without Docker. It uses
//! DATABASE_URL / NATS_URL when given, otherwise starts private PostgreSQL
//! and NATS servers under `--data-dir`; migrates; seeds a demo product and
//! account; starts the services as child processes with prefixed logs; and
//! stops everything on Ctrl-C. With `--demo` it runs a flash sale and exits.

use crate::children::{spawn_console, spawn_service, stop, wait_ready};
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use base64::Engine;
use clap::Args;
use localservers::{Nats, PgOptions, Postgres};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::process::Child;

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
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir).context("resolving --data-dir")?;
    let (database_url, _pg) = match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => (url, None),
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
            (pg.url("postgres"), Some(pg))
        }
    };
    let (nats_url, _nats) = match std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => (url, None),
        None => {
            eprintln!(
                "up: starting NATS JetStream in {}",
                data_dir.join("nats").display()
            );
            let nats = Nats::start_in(&data_dir.join("nats")).context("starting nats-server")?;
            (nats.url(), Some(nats))
        }
    };
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
    // 32 random bytes: a fresh signing key per run, never a shipped one.
    let key: Vec<u8> = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
        .iter()
        .flat_map(|u| *u.as_bytes())
        .collect();
    let secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let env = [
        ("PSP_SIM_ADDR", psp_addr.clone()),
        ("PSP_URL", format!("http://{psp_addr}")),
        ("PSP_WEBHOOK_URL", format!("{checkout_url}/v1/psp/webhooks")),
        ("WEBHOOK_SECRET", secret),
        ("PAYMENT_WORKER_ADDR", "127.0.0.1:0".to_owned()),
        ("EXPIRY_ADDR", "127.0.0.1:0".to_owned()),
        ("FULFILLMENT_ADDR", "127.0.0.1:0".to_owned()),
        ("DATABASE_URL", database_url.clone()),
        ("NATS_URL", nats_url.clone()),
        ("CHECKOUT_ADDR", args.checkout_addr.clone()),
        ("OUTBOX_RELAY_ADDR", "127.0.0.1:0".to_owned()),
        (
            platform::runtime::WORKER_THREADS,
            worker_share(&args.only).to_string(),
        ),
        // A person reads these logs, prefixed with each service's name.
        ("LOG_FORMAT", "text".to_owned()),
    ];
    if let Some(unknown) = args
        .only
        .iter()
        .find(|s| !SERVICES.contains(&s.as_str()) && s.as_str() != "console")
    {
        return Err(CliError::Usage(format!(
            "--only: unknown service {unknown:?}; known: {}, console",
            SERVICES.join(", ")
        )));
    }
    // A service address or secret already set in the environment wins over
    // up's default; the addresses up itself derives URLs from do not.
    let derived = [
        "CHECKOUT_ADDR",
        "PSP_SIM_ADDR",
        "PSP_URL",
        "PSP_WEBHOOK_URL",
        "DATABASE_URL",
        "NATS_URL",
    ];
    let env: Vec<(&str, String)> = env
        .into_iter()
        .map(|(k, v)| {
            match std::env::var(k)
                .ok()
                .filter(|x| !x.is_empty() && !derived.contains(&k))
            {
                Some(given) => (k, given),
                None => (k, v),
            }
        })
        .collect();
    let mut children = Vec::new();
    // Each child's name, beside it.
    let mut names: Vec<&'static str> = Vec::new();
    for service in started(&args.only) {
        children.push(spawn_service(service, &env)?);
        names.push(service);
    }
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
    let mut console = args.only.is_empty() || args.only.iter().any(|s| s == "console");
    // A console whose address is taken is not worth failing the system for.
    if console && std::net::TcpListener::bind(console_addr.as_str()).is_err() {
        eprintln!(
            "up: not starting the console: {console_addr} is taken or invalid (set CONSOLE_ADDR)"
        );
        console = false;
    }
    if console {
        let mut console_env = env.clone();
        console_env.push(("CONSOLE_ADDR", console_addr.clone()));
        console_env.push(("CONSOLE_TOKEN", console_token.clone()));
        children.push(spawn_console(&console_env)?);
        names.push("console");
    }
    if args.only.is_empty() || args.only.iter().any(|s| s == "psp-sim") {
        wait_ready(&format!("http://{psp_addr}/healthz")).await?;
    }
    if console {
        wait_ready(&format!("http://{console_addr}/healthz")).await?;
        eprintln!("up: console at http://{console_addr}/#token={console_token}");
    }
    if args.only.is_empty() || args.only.iter().any(|s| s == "checkout") {
        wait_ready(&format!("{checkout_url}/readyz")).await?;
    }
    let env_file = data_dir.join("env");
    let exports = format!(
        "export DATABASE_URL='{database_url}'\nexport NATS_URL='{nats_url}'\nexport CHECKOUT_URL='{checkout_url}'\nexport SOLDONCE_TOKEN='{token}'\n{}",
        if console {
            format!("export CONSOLE_URL='http://{console_addr}/'\nexport CONSOLE_TOKEN='{console_token}'\n")
        } else {
            String::new()
        }
    );
    write_private(&env_file, &exports).context("writing the env file")?;
    print_banner(&checkout_url, &database_url, &nats_url, &token, &env_file);

    if args.demo {
        let code =
            crate::demo::flash_sale(&pool, &checkout_url, &token, args.buyers, args.stock, out)
                .await;
        stop(children).await;
        return code;
    }
    eprintln!("up: running; Ctrl-C stops everything");
    // A child that ends is a fault to see, not one to restart around: up
    // names it and stops the rest (compose restarts its services instead).
    let ended = tokio::select! {
        () = platform::shutdown::signal() => None,
        ended = first_exit(&mut children, &names) => Some(ended),
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
/// (measured on 2 cores: README, "Worker threads").
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
