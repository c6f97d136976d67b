//! `soldonce`: the operator and engineer command line — migrate, catalogue
//! and stock administration, accounts, dead letters and parked events, and
//! a load generator. Bad input is
//! one line on stderr and exit code 2; a failure at run time is exit 1.
//!
//! Layout:
//! - `main.rs` — the command tree and exit codes
//! - `admin.rs` — migrate, stock, accounts, projections, the audit
//! - `database.rs` — the connection to DATABASE_URL every command uses
//! - `product.rs` — the catalogue: add, show, update, deactivate/activate, limits
//! - `dead_letters.rs` — `dead-letters list|redrive`
//! - `findings.rs` — `findings list|ack`: disputes and the like, for a person
//! - `outbox.rs` — `outbox parked|requeue`
//! - `up.rs` — a whole local system for trying soldonce
//!   (`up/env.rs`: what it tells its services and the shell)
//! - `demo.rs` — a flash sale shown end to end
//! - `load.rs` — the load generator (`load/drive.rs`: driven by the demo and the benches)
//! - `console/` — `console`: the live operator page (its assets in `console/assets/`)
//! - `bench.rs` — `bench flash-sale|saga|compare|relay|expiry`: measurement
//! - `events.rs` — `events tail` and `order show`
//! - `replay.rs` — rebuild from the stream and diff with the live projections
//! - `stream.rs` — `stream check|repair`: the stream against `events`, and what it lost republished
//! - `schemas.rs` — the event schemas, compiled
//! - `reconcile.rs` — `reconcile` against the PSP
//! - `output.rs` — text or `--json` output

mod admin;
mod bench;
mod children;
mod console;
mod database;
mod dead_letters;
mod demo;
mod events;
mod findings;
mod load;
mod order;
mod outbox;
mod output;
mod product;
mod reconcile;
mod replay;
mod schemas;
mod stream;
mod up;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// soldonce: every unit sold once, every payment charged once, every order ends.
#[derive(Debug, Parser)]
#[command(name = "soldonce", version, about)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Apply the database migrations (reads DATABASE_URL).
    Migrate,
    /// Manage the catalogue.
    #[command(subcommand)]
    Product(product::ProductCommand),
    /// Receive, adjust and show stock (every change is a ledger entry).
    #[command(subcommand)]
    Stock(admin::StockCommand),
    /// Manage API accounts.
    #[command(subcommand)]
    Account(admin::AccountCommand),
    /// Check every invariant from the database; exit 1 naming each violation.
    /// Each run is recorded (the console shows the last one).
    Audit {
        /// Outbox rows older than this many seconds count as a violation.
        #[arg(long, default_value_t = 300.0, value_parser = seconds)]
        max_outbox_age: f64,
        /// Confirmed orders without a shipment for longer than this many seconds count as a violation.
        #[arg(long, default_value_t = 600.0, value_parser = seconds)]
        shipment_grace: f64,
        /// Decided refunds not carried out within this many seconds count as a violation.
        #[arg(long, default_value_t = 60.0, value_parser = seconds)]
        compensation_grace: f64,
        /// Check only what changed since the last recorded run (a full pass when there is
        /// none, or the last full pass is older than --full-every).
        #[arg(long, conflicts_with = "last")]
        incremental: bool,
        /// With --incremental: seconds after which a full pass is due again.
        #[arg(long, default_value_t = 3600.0, value_parser = seconds)]
        full_every: f64,
        /// With --incremental: the share of its time the audit works, in (0, 1]; it rests
        /// the rest (expiry's periodic audit runs at AUDIT_PACE, 0.25 by default).
        #[arg(long, default_value_t = 1.0, value_parser = pace)]
        pace: f64,
        /// Show the last recorded run instead of auditing (exit 1 if it found violations).
        #[arg(long)]
        last: bool,
    },
    /// Reconcile soldonce's books with the PSP's (reads DATABASE_URL and PSP_URL): record a refund
    /// for every payment that cannot be attached to its order, and name what cannot be repaired.
    Reconcile(reconcile::ReconcileArgs),
    /// Demonstrations against a running system.
    #[command(subcommand)]
    Demo(demo::DemoCommand),
    /// Rebuild the projections from the JetStream stream in a scratch schema and diff them with the live ones.
    Replay(replay::ReplayArgs),
    /// Live events from the stream.
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Compare the JetStream stream with the database's events, and republish what it lost.
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Orders for operators.
    #[command(subcommand)]
    Order(OrderCommand),
    /// Messages consumers gave up on: list them, and send them again once the cause is fixed.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// What a person must look at (disputes): list them, and acknowledge each once handled.
    #[command(subcommand)]
    Findings(findings::FindingsCommand),
    /// Events the relay could never publish (parked): list them, and put them back once the cause is fixed.
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// Rebuild read models from the event store.
    #[command(subcommand)]
    Projections(admin::ProjectionsCommand),
    /// Drive load at a running checkout and check the result against the database.
    Load(load::LoadArgs),
    /// Benchmarks: the saga, two builds compared, the relay, expiry (each on private
    /// servers of its own), and flash-sale write strategies (on a database of its own).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run the whole system locally (private PostgreSQL and NATS unless DATABASE_URL/NATS_URL are set).
    Up(up::UpArgs),
    /// Serve the live operator console (reads DATABASE_URL, NATS_URL and CONSOLE_TOKEN).
    Console(console::ConsoleArgs),
}

#[derive(Debug, Subcommand)]
enum OrderCommand {
    /// An order's timeline: events, payment and shipment.
    Show { id: String },
    /// Refund part or all of what a confirmed order's payment took, once per --key
    /// (never more than it took); the payment worker carries it out.
    Refund(order::RefundArgs),
    /// Cancel an order before its goods leave: its units go back on sale, its
    /// payment is voided (authorized) or refunded (taken); again changes nothing
    Cancel(order::CancelArgs),
}

/// How a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The user asked for something invalid: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Something failed while running: exit 1.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
}

/// A number of seconds: finite and not negative.
fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=1e9).contains(&s) => Ok(s),
        _ => Err(format!("{text:?} is not a number of seconds (0 or more)")),
    }
}

fn pace(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "{text:?} is not a share in (0, 1] (0.25: work a quarter of the time)"
        )),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let line = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("soldonce: {line} (see soldonce --help)");
            return ExitCode::from(2);
        }
    };
    let threads = match platform::runtime::worker_threads() {
        Ok(threads) => threads,
        Err(e) => {
            eprintln!("soldonce: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match platform::runtime::build(threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soldonce: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(CliError::Usage(msg)) => {
            eprintln!("soldonce: {msg}");
            ExitCode::from(2)
        }
        Err(CliError::Failed(e)) => {
            eprintln!("soldonce: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let out = output::Output { json: cli.json };
    match cli.command {
        Commands::Migrate => admin::migrate(&out).await,
        Commands::Product(cmd) => product::run(cmd, &out).await,
        Commands::Stock(cmd) => admin::stock(cmd, &out).await,
        Commands::Account(cmd) => admin::account(cmd, &out).await,
        Commands::Audit {
            max_outbox_age,
            shipment_grace,
            compensation_grace,
            incremental,
            full_every,
            pace,
            last,
        } => {
            let options = store::audit::AuditOptions {
                max_outbox_age: std::time::Duration::from_secs_f64(max_outbox_age),
                shipment_grace: std::time::Duration::from_secs_f64(shipment_grace),
                compensation_grace: std::time::Duration::from_secs_f64(compensation_grace),
                full_every: std::time::Duration::from_secs_f64(full_every),
                pace,
                ..store::audit::AuditOptions::default()
            };
            match (last, incremental) {
                (true, _) => admin::last_audit(&out).await,
                (false, incremental) => admin::audit(options, incremental, &out).await,
            }
        }
        Commands::Reconcile(args) => reconcile::run(args, &out).await,
        Commands::Demo(cmd) => demo::run(cmd, &out).await,
        Commands::Replay(args) => replay::run(args, &out).await,
        Commands::Events(cmd) => events::tail(cmd, &out).await,
        Commands::Stream(cmd) => stream::run(cmd, &out).await,
        Commands::Order(OrderCommand::Show { id }) => events::show(&id, &out).await,
        Commands::Order(OrderCommand::Refund(args)) => order::refund(args, &out).await,
        Commands::Order(OrderCommand::Cancel(args)) => order::cancel(args, &out).await,
        Commands::DeadLetters(cmd) => dead_letters::run(cmd, &out).await,
        Commands::Findings(cmd) => findings::run(cmd, &out).await,
        Commands::Outbox(cmd) => outbox::run(cmd, &out).await,
        Commands::Projections(cmd) => admin::projections(cmd, &out).await,
        Commands::Load(args) => load::run(args, &out).await,
        Commands::Bench(cmd) => bench::run(cmd, &out).await,
        Commands::Up(args) => up::run(args, &out).await,
        Commands::Console(args) => console::run(args).await,
    }
}
