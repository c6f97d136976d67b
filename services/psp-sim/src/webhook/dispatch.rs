//! The background task between the queue and the receiver: drops, duplicates, delays and
//! reorders webhooks as the faults in force say, and runs each delivery as its own task.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Deliverer, WebhookEvent};
use crate::counters::{Counters, Fault};
use crate::faults::{roll, FaultSwitch, Faults};

/// With `webhook_reorder`, a batch is released once it holds this many events…
const REORDER_BATCH: usize = 3;
/// …or once its first event has waited this long.
const REORDER_WINDOW: Duration = Duration::from_millis(100);
/// Gap between the first attempts of a released batch, so newest-first is what arrives.
const REORDER_STAGGER: Duration = Duration::from_millis(50);

/// Owns the queue's receiving end until the application stops.
pub struct Dispatcher {
    events: mpsc::UnboundedReceiver<WebhookEvent>,
    deliverer: Arc<Deliverer>,
    faults: Arc<FaultSwitch>,
    counters: Arc<Counters>,
    stop: watch::Receiver<bool>,
    deliveries: JoinSet<()>,
    held: Vec<(WebhookEvent, Faults)>,
    release_at: Option<Instant>,
}

impl Dispatcher {
    /// A dispatcher reading `events` until `stop` turns true (or its sender goes away).
    pub fn new(
        events: mpsc::UnboundedReceiver<WebhookEvent>,
        deliverer: Deliverer,
        faults: Arc<FaultSwitch>,
        counters: Arc<Counters>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            events,
            deliverer: Arc::new(deliverer),
            faults,
            counters,
            stop,
            deliveries: JoinSet::new(),
            held: Vec::new(),
            release_at: None,
        }
    }

    /// Runs until stopped; deliveries still retrying then are abandoned (state is in memory).
    pub async fn run(mut self) {
        let mut stop = self.stop.clone();
        loop {
            let release_at = self.release_at;
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => break,
                Some(_) = self.deliveries.join_next() => {}
                () = sleep_until(release_at), if release_at.is_some() => self.release_held(),
                event = self.events.recv() => match event {
                    Some(event) => self.accept(event),
                    None => break,
                },
            }
        }
        self.deliveries.shutdown().await;
    }

    fn accept(&mut self, event: WebhookEvent) {
        let faults = self.faults.current();
        if roll(faults.drop_webhook_rate) {
            self.counters.fault_injected(Fault::DropWebhook, 1);
            tracing::info!(webhook_id = %event.id, "webhook dropped on purpose");
            return;
        }
        if faults.webhook_reorder {
            self.held.push((event, faults));
            if self.held.len() == 1 {
                self.release_at = Some(Instant::now() + REORDER_WINDOW);
            }
            if self.held.len() >= REORDER_BATCH {
                self.release_held();
            }
        } else {
            self.launch(event, &faults, Duration::ZERO);
        }
    }

    /// Sends the held batch newest first.
    fn release_held(&mut self) {
        self.release_at = None;
        let held = std::mem::take(&mut self.held);
        if held.len() > 1 {
            self.counters.fault_injected(Fault::ReorderWebhooks, 1);
        }
        let mut stagger = Duration::ZERO;
        for (event, faults) in held.into_iter().rev() {
            self.launch(event, &faults, stagger);
            stagger += REORDER_STAGGER;
        }
    }

    fn launch(&mut self, event: WebhookEvent, faults: &Faults, extra_delay: Duration) {
        let copies = faults.webhook_duplicates.max(1);
        if copies > 1 {
            self.counters
                .fault_injected(Fault::DuplicateWebhook, u64::from(copies - 1));
        }
        let delay = Duration::from_millis(faults.webhook_delay_ms) + extra_delay;
        for _ in 0..copies {
            let deliverer = Arc::clone(&self.deliverer);
            let event = event.clone();
            self.deliveries.spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                deliverer.deliver(&event).await;
            });
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
