//! `soldonce events tail` and `soldonce order show`: what is happening now,
//! and what happened to one order.

use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use clap::{Args, Subcommand};
use events::CloudEvent;
use futures::StreamExt;
use std::process::ExitCode;
use uuid::Uuid;

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Follow live events: readable lines, or JSON lines with --json.
    Tail(TailArgs),
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// Only this type, e.g. order.confirmed (any version) or soldonce.order.confirmed.v1.
    #[arg(long = "type")]
    event_type: Option<String>,
    /// Only this order's events.
    #[arg(long)]
    order: Option<Uuid>,
    /// Start from the beginning of the stream instead of now.
    #[arg(long)]
    from_start: bool,
}

pub async fn tail(cmd: EventsCommand, out: &Output) -> Result<ExitCode, CliError> {
    let EventsCommand::Tail(args) = cmd;
    let nats_url = platform::config::nats_url().map_err(|e| CliError::Usage(e.to_string()))?;
    let js = bus::connect(&nats_url)
        .await
        .context("connecting to NATS_URL")?;
    let stream = js
        .get_stream(bus::STREAM)
        .await
        .context("opening the SOLDONCE stream")?;
    let deliver_policy = if args.from_start {
        DeliverPolicy::All
    } else {
        DeliverPolicy::New
    };
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await
        .context("subscribing")?;
    let mut messages = consumer.messages().await.context("subscribing")?;
    let wanted = args
        .event_type
        .map(|t| events::names::type_name(&t).unwrap_or(&t).to_owned());
    loop {
        let next = tokio::select! {
            next = messages.next() => next,
            () = platform::shutdown::signal() => break,
        };
        let Some(message) = next else { break };
        let message = message.context("reading the stream")?;
        let seq = message.info().map(|i| i.stream_sequence).unwrap_or(0);
        if events::names::is_redrive(&message.subject) {
            continue;
        }
        let Ok(event) = serde_json::from_slice::<CloudEvent>(&message.payload) else {
            eprintln!("#{seq} {}: not a soldonce event", message.subject);
            continue;
        };
        let ty = events::names::type_name(&event.event_type).unwrap_or(&event.event_type);
        if wanted.as_deref().is_some_and(|w| !ty.starts_with(w)) {
            continue;
        }
        let order = events::decode(&event)
            .map(|d| d.order_id().to_string())
            .unwrap_or_else(|_| event.subject.clone());
        if args.order.is_some_and(|o| o.to_string() != order) {
            continue;
        }
        if out.json {
            println!("{}", serde_json::to_string(&event).unwrap_or_default());
        } else {
            println!(
                "#{seq} {} {ty:<26} order {order} {}",
                event.time.format("%H:%M:%S%.3f"),
                event.data
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `soldonce order show ID`: the order, its timeline, payment and shipment.
pub async fn show(id: &str, out: &Output) -> Result<ExitCode, CliError> {
    let id: Uuid = id
        .parse()
        .map_err(|_| CliError::Usage(format!("{id:?} is not an order id (a UUID)")))?;
    let pool = crate::database::pool().await?;
    let Some(order) = store::orders::load(&pool, id, None)
        .await
        .context("reading the order")?
    else {
        return Err(CliError::Usage(format!("no order {id}")));
    };
    let events = store::orders::history(&pool, id, None)
        .await
        .context("reading its events")?
        .unwrap_or_default();
    let shipment = store::shipments::for_order(&pool, id)
        .await
        .context("reading its shipment")?
        .map(|s| serde_json::json!({ "id": s.id, "state": s.state.as_str() }));
    let (stages, trace_id) = store::orders::stages(&pool, id)
        .await
        .context("reading its stages")?;
    let value = serde_json::json!({
        "order": order, "events": events, "shipment": shipment,
        "trace_id": trace_id, "stages": stages,
    });
    out.print(&value, || {
        let mut t = format!(
            "order {id}  {}  total {} {}  ({} lines)\n",
            order.state,
            order.total_minor,
            order.currency,
            order.lines.len()
        );
        for line in &order.lines {
            t.push_str(&format!(
                "  {} × {} at {}\n",
                line.quantity.get(),
                line.sku,
                line.unit_price_minor
            ));
        }
        t.push_str("timeline:\n");
        for e in &events {
            t.push_str(&format!(
                "  {}  v{} {}  {}\n",
                e.recorded_at.format("%Y-%m-%d %H:%M:%S%.3f"),
                e.version,
                e.event_type,
                e.data
            ));
        }
        match &order.payment {
            Some(p) => t.push_str(&format!(
                "payment: {} ({} minor units)\n",
                p.payment_id, p.amount_minor
            )),
            None => t.push_str("payment: none settled\n"),
        }
        match &shipment {
            Some(s) => t.push_str(&format!(
                "shipment: {} {}\n",
                s["id"].as_str().unwrap_or_default(),
                s["state"].as_str().unwrap_or_default()
            )),
            None => t.push_str("shipment: none\n"),
        }
        t.push_str(&format!(
            "trace id: {}\n",
            trace_id.as_deref().unwrap_or("none recorded")
        ));
        t.push_str(&stage_timings(&stages));
        t
    });
    Ok(ExitCode::SUCCESS)
}

/// Each step's time since the order was placed and since the step before:
/// where the order's time went, stage by stage.
fn stage_timings(stages: &[store::orders::Stage]) -> String {
    let Some(first) = stages.first() else {
        return String::new();
    };
    let ms = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1000.0;
    let mut t = String::from("stages (ms since placed, ms since the step before):\n");
    let mut before = first.at;
    for s in stages {
        let who = if s.by == "recorded" {
            format!("recorded {}", s.event_type)
        } else {
            format!("{} took {}", s.by, s.event_type)
        };
        t.push_str(&format!(
            "  {:>10.1} {:>+10.1}  {who}\n",
            ms(s.at - first.at),
            ms(s.at - before)
        ));
        before = s.at;
    }
    t
}
