//! `soldonce replay`: reads the JetStream stream with an ordered consumer
//! (from the start, a stream sequence or a time, optionally one order),
//! validates every event against `proto/events/`, folds the events into the
//! orders and shipments projections (in the order `events` recorded them:
//! see `fold`) in a scratch schema, and diffs them with the live ones. Exit
//! 1 on any difference or invalid event, naming it.

mod fold;
mod read;

use crate::output::Output;
use crate::schemas::Schemas;
use crate::CliError;
use anyhow::Context;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::{State as StreamState, Stream};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::process::ExitCode;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Start at this stream sequence.
    #[arg(long, conflicts_with = "since")]
    from_seq: Option<u64>,
    /// Start at the first event at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only this order's events (and its shipment's).
    #[arg(long)]
    order: Option<Uuid>,
    /// Keep the scratch schema for inspection.
    #[arg(long)]
    keep: bool,
}

/// What replay found.
#[derive(Debug, Default, Serialize)]
pub struct ReplayReport {
    /// The stream's first sequence when its limits dropped older messages:
    /// orders placed before it are not compared.
    pub kept_from_sequence: Option<u64>,
    pub events: u64,
    /// Orders refolded in position order: events republished after a loss
    /// reached the stream after younger events of theirs.
    pub refolded: usize,
    pub orders: usize,
    pub shipments: usize,
    pub seconds: f64,
    pub events_per_second: f64,
    pub invalid: Vec<String>,
    pub differences: Vec<String>,
}

pub async fn run(args: ReplayArgs, out: &Output) -> Result<ExitCode, CliError> {
    let nats_url = platform::config::nats_url().map_err(|e| CliError::Usage(e.to_string()))?;
    let pool = crate::database::pool().await?;
    let schemas = Schemas::load()?;
    let (mut stream, state) = open_stream(&nats_url).await?;
    let last = state.last_sequence;
    // The stream's limits (STREAM_MAX_AGE, STREAM_MAX_BYTES) drop its oldest
    // messages: an order placed before what it keeps cannot be rebuilt from it.
    let truncated = state.first_sequence > 1;
    let deliver_policy = match (args.from_seq, args.since) {
        (Some(start_sequence), _) => DeliverPolicy::ByStartSequence { start_sequence },
        (None, Some(start_time)) => DeliverPolicy::ByStartTime { start_time },
        (None, None) => DeliverPolicy::All,
    };
    let first = args.from_seq.unwrap_or(1);
    let started = std::time::Instant::now();
    let mut report = ReplayReport {
        kept_from_sequence: truncated.then_some(state.first_sequence),
        ..ReplayReport::default()
    };
    let mut fold = fold::Fold::new(args.order);
    if last >= first {
        fold_stream(
            &mut stream,
            deliver_policy,
            first..=last,
            &schemas,
            &mut fold,
            &mut report,
            out.json,
        )
        .await?;
    }
    let orders = fold.orders;
    let shipments: BTreeMap<Uuid, domain::shipment::ShipmentEvent> = fold
        .shipments
        .into_iter()
        .map(|(id, (_, s))| (id, s))
        .collect();
    report.invalid = fold.invalid;
    report.orders = orders.len();
    report.shipments = shipments.len();
    report.seconds = started.elapsed().as_secs_f64();
    report.events_per_second = report.events as f64 / report.seconds.max(1e-9);
    report.differences = diff(
        &pool,
        &orders,
        &shipments,
        args.order.is_none() && first == 1 && !truncated,
        args.keep,
    )
    .await?;
    out.print(&report, || render(&report));
    Ok(
        if report.invalid.is_empty() && report.differences.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// The SOLDONCE stream, and its state as the replay starts.
async fn open_stream(nats_url: &str) -> Result<(Stream, StreamState), CliError> {
    let js = bus::connect(nats_url)
        .await
        .context("connecting to NATS_URL")?;
    let mut stream = js
        .get_stream(bus::STREAM)
        .await
        .context("opening the SOLDONCE stream")?;
    let state = stream
        .info()
        .await
        .context("reading the stream")?
        .state
        .clone();
    Ok((stream, state))
}

/// Folds the events at `sequences` into `fold`, counting them in `report`
/// (a progress bar on stderr unless the output is JSON); then refolds the
/// orders whose events came out of order.
async fn fold_stream(
    stream: &mut Stream,
    deliver_policy: DeliverPolicy,
    sequences: RangeInclusive<u64>,
    schemas: &Schemas,
    fold: &mut fold::Fold,
    report: &mut ReplayReport,
    json: bool,
) -> Result<(), CliError> {
    let (first, last) = (*sequences.start(), *sequences.end());
    let bar = ProgressBar::new(last - first + 1);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} events  {per_sec}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    read::read(stream, deliver_policy, last, |seq, position, payload| {
        bar.set_position(seq.saturating_sub(first) + 1);
        report.events += 1;
        fold.add(schemas, seq, position, payload);
    })
    .await?;
    bar.finish_and_clear();
    if !fold.disordered.is_empty() {
        report.refolded = refold_disordered(stream, deliver_policy, last, schemas, fold).await?;
    }
    Ok(())
}

/// Reads the stream again for the events of the orders `fold` found out of
/// order and refolds those orders in position order; returns how many.
async fn refold_disordered(
    stream: &mut Stream,
    deliver_policy: DeliverPolicy,
    last: u64,
    schemas: &Schemas,
    fold: &mut fold::Fold,
) -> Result<usize, CliError> {
    // Events republished after a loss came after younger ones of their orders.
    let mut events = Vec::new();
    read::read(stream, deliver_policy, last, |_, position, payload| {
        if let (Some(p), Ok(fold::Decoded::Order(id, event))) =
            (position, fold::decode(schemas, payload))
        {
            if fold.disordered.contains(&id) {
                events.push((p, id, event));
            }
        }
    })
    .await?;
    let refolded = fold.disordered.len();
    fold.refold(events);
    Ok(refolded)
}

/// Writes the folded projections into a scratch schema and compares them
/// with the live ones; `everything` also flags live rows the stream lacks.
async fn diff(
    pool: &sqlx::PgPool,
    orders: &HashMap<Uuid, Option<domain::Order>>,
    shipments: &BTreeMap<Uuid, domain::shipment::ShipmentEvent>,
    everything: bool,
    keep: bool,
) -> Result<Vec<String>, CliError> {
    let mut tx = pool.begin().await.context("opening a transaction")?;
    let live = store::projections::snapshot(&mut tx)
        .await
        .context("reading the live projection")?;
    let live_shipments = store::projections::snapshot_shipments(&mut tx)
        .await
        .context("reading shipments")?;
    let scratch = store::replay::enter_scratch(&mut tx)
        .await
        .context("preparing the scratch schema")?;
    for order in orders.values().flatten() {
        store::projections::write(&mut tx, order)
            .await
            .context("writing the replayed projection")?;
    }
    let replayed = store::projections::snapshot(&mut tx)
        .await
        .context("reading the replayed projection")?;
    if keep {
        tx.commit().await.context("keeping the scratch schema")?;
        eprintln!("replay: the replayed projection is kept in schema {scratch}");
    } else {
        tx.rollback().await.context("dropping the scratch schema")?;
    }
    let mut differences = vec![];
    for (id, row) in &replayed {
        match live.get(id) {
            Some(l) if l == row => {}
            Some(l) => differences.push(format!(
                "order {id}: live {} / stream {}",
                brief(l),
                brief(row)
            )),
            None => differences.push(format!(
                "order {id}: in the stream, missing from the live projection"
            )),
        }
    }
    if everything {
        for id in live.keys().filter(|id| !replayed.contains_key(id)) {
            differences.push(format!(
                "order {id}: in the live projection, missing from the stream"
            ));
        }
    }
    let live_by_id: HashMap<Uuid, String> = live_shipments
        .into_iter()
        .map(|(id, row)| (id, row["state"].as_str().unwrap_or("?").to_owned()))
        .collect();
    for (id, s) in shipments {
        match live_by_id.get(id) {
            Some(state) if state == s.state.as_str() => {}
            Some(state) => differences.push(format!(
                "shipment {id}: live {state} / stream {}",
                s.state.as_str()
            )),
            None => differences.push(format!(
                "shipment {id}: in the stream, missing from the live shipments"
            )),
        }
    }
    if everything {
        for id in live_by_id.keys().filter(|id| !shipments.contains_key(id)) {
            differences.push(format!(
                "shipment {id}: in the live shipments, missing from the stream"
            ));
        }
    }
    Ok(differences)
}

fn brief(row: &serde_json::Value) -> String {
    format!(
        "{} v{}",
        row["state"].as_str().unwrap_or("?"),
        row["version"]
    )
}

fn render(r: &ReplayReport) -> String {
    let mut t = format!(
        "replayed {} events ({} orders, {} shipments) in {:.2}s: {:.0} events/s",
        r.events, r.orders, r.shipments, r.seconds, r.events_per_second
    );
    if let Some(first) = r.kept_from_sequence {
        t.push_str(&format!(
            "\nthe stream keeps messages from sequence {first} on (its limits dropped older ones): orders placed before are not compared"
        ));
    }
    if r.invalid.is_empty() && r.differences.is_empty() {
        t.push_str("\nthe stream reproduces the live projections exactly");
    }
    for i in &r.invalid {
        t.push_str(&format!("\nINVALID {i}"));
    }
    for d in &r.differences {
        t.push_str(&format!("\nDIFFERENCE {d}"));
    }
    t
}
