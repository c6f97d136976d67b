//! fulfillment: consumes `order.confirmed`, creates exactly one shipment per
//! order (a redelivery finds it), and advances shipments through a simulated
//! warehouse — pending → picked → shipped → delivered — one step per
//! `FULFILLMENT_STEP_DELAY`, each step an event on the bus. When a shipment
//! ships, an order confirmed on an authorization has its capture decided
//! (`order.capture_decided`; the payment worker carries it out). It must
//! never ship an order that is not confirmed, nor a shipment a dispute
//! holds (`store::disputes`).
//!
//! Layout:
//! - `lib.rs` — settings, the `order.confirmed` handler, the step loop
//! - `metric_help.rs` — what each metric it records means
//! - `main.rs` — `--check-config` and the run

mod metric_help;
pub use metric_help::METRICS;

use anyhow::Context;
use bus::consumer::{Delivery, HandleError, Handler, Tx};
use events::Metadata;
use platform::app::{self, App};
use platform::config::{self, ConfigError};
use platform::ops;
use sqlx::PgPool;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use store::inbox::PgInbox;
use store::shipments::Created;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use uuid::Uuid;

/// fulfillment's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `FULFILLMENT_ADDR`, default `127.0.0.1:8084`.
    pub addr: SocketAddr,
    pub database_url: String,
    pub nats_url: String,
    /// `FULFILLMENT_STEP_DELAY`, default 200ms: time between warehouse steps.
    pub step_delay: Duration,
    /// `CONSUMER_BATCH_SIZE` (default 32: confirmed orders taken at once,
    /// and the most handled in one transaction), `CONSUMER_RECORDERS`
    /// (one per core, at most 4) and `CONSUMER_LINGER` (default [`LINGER`]).
    pub batching: bus::consumer::Batching,
    pub stream: bus::StreamSettings,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Settings {
            addr: config::var(
                "FULFILLMENT_ADDR",
                "where /healthz /readyz /metrics listen; port 0 picks a free port",
            )
            .parsed(SocketAddr::from(([127, 0, 0, 1], 8084)))?,
            database_url: config::database_url()?,
            nats_url: config::nats_url()?,
            step_delay: config::var(
                "FULFILLMENT_STEP_DELAY",
                "the simulated warehouse's time between a shipment's steps",
            )
            .duration(Duration::from_millis(200))?,
            batching: bus::consumer::Batching::from_env(LINGER)?,
            stream: bus::StreamSettings::from_env()?,
        })
    }
}

/// `CONSUMER_LINGER`'s default here: a confirmed order waits up to 20 ms
/// for others to be shipped with it. No buyer waits on it (the warehouse's
/// own steps take `FULFILLMENT_STEP_DELAY`), and under a light load it
/// gathers several orders into each transaction instead of one.
pub const LINGER: Duration = Duration::from_millis(20);

/// The event fulfillment consumes.
const CONSUMES: &str = "order.confirmed.v1";

/// Creates shipments for confirmed orders, and tells the warehouse loop.
struct ShipOrders {
    /// Woken after a commit that created shipments: their first step's
    /// time is new to the warehouse loop.
    created: Arc<Notify>,
}

impl Handler for ShipOrders {
    type Inbox = PgInbox;
    /// The order to ship.
    type Prepared = Uuid;
    /// Shipments created: each order with its trace id, for the log.
    type Recorded = Vec<(Uuid, String)>;

    async fn prepare(&self, d: &Delivery) -> Result<Uuid, HandleError> {
        Ok(events::decode(&d.event)
            .map_err(|e| HandleError::Permanent(e.to_string()))?
            .order_id())
    }

    async fn record(
        &self,
        tx: &mut Tx<Self>,
        batch: &[(&Delivery, &Uuid)],
    ) -> Result<Vec<(Uuid, String)>, HandleError> {
        // Never trust the message: the store ships only what the database says is confirmed.
        let orders: Vec<(Uuid, Metadata)> = batch
            .iter()
            .map(|(d, order_id)| {
                let meta = Metadata::caused_by("fulfillment", &d.event, d.traceparent.clone())
                    .with_tracestate(d.tracestate.clone());
                (**order_id, meta)
            })
            .collect();
        let answers = store::shipments::create_many(tx, &orders)
            .await
            .context("creating the shipments")?;
        let mut created = vec![];
        for ((d, order_id), answer) in batch.iter().zip(answers) {
            match answer {
                Created::New(_) => created.push((**order_id, d.trace_id())),
                Created::Existed => {}
                // An operator cancelled it before fulfillment came to it.
                Created::NotConfirmed(Some(domain::OrderState::Cancelled)) => {
                    tracing::info!(order_id = %order_id, trace_id = %d.trace_id(), "not shipping an order cancelled since");
                }
                Created::NotConfirmed(state) => {
                    tracing::warn!(order_id = %order_id, trace_id = %d.trace_id(), state = ?state, "not shipping an order that is not confirmed");
                }
            }
        }
        Ok(created)
    }

    fn committed(&self, created: Vec<(Uuid, String)>) {
        metrics::counter!("soldonce_shipments_created_total").increment(created.len() as u64);
        if !created.is_empty() {
            self.created.notify_one();
        }
        for (order_id, trace_id) in created {
            tracing::info!(%order_id, %trace_id, "shipment created");
        }
    }
}

/// The consumer spec of fulfillment.
pub fn consumer_spec(batching: bus::consumer::Batching) -> bus::consumer::ConsumerSpec {
    bus::consumer::ConsumerSpec {
        name: "fulfillment".into(),
        filter_subjects: vec![events::names::subjects_of(CONSUMES)],
        types: vec![events::names::event_type(CONSUMES)],
        ack_wait: Duration::from_secs(30),
        max_deliver: 20,
        backoff: vec![
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(30),
        ],
        concurrency: 64,
        batching,
    }
}

/// A fulfillment process, connected and bound.
pub struct Application {
    listener: TcpListener,
    pool: PgPool,
    js: async_nats::jetstream::Context,
    step_delay: Duration,
    batching: bus::consumer::Batching,
}

impl Application {
    /// Connects to PostgreSQL and NATS, ensures the stream, binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        platform::metric::describe(&[
            platform::metric::METRICS,
            store::METRICS,
            bus::METRICS,
            METRICS,
        ]);
        let pool = store::connect_with_settings(&settings.database_url, 8, store::timeouts::WORKER)
            .await
            .context("connecting to DATABASE_URL")?;
        let js = bus::open(&settings.nats_url, &settings.stream).await?;
        let listener = app::bind(settings.addr).await?;
        Ok(Application {
            listener,
            pool,
            js,
            step_delay: settings.step_delay,
            batching: settings.batching,
        })
    }

    /// The operations endpoint's address.
    pub fn local_addr(&self) -> SocketAddr {
        app::local_addr(&self.listener)
    }

    /// Runs until `shutdown`; work in hand is finished first.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Application {
            listener,
            pool,
            js,
            step_delay,
            batching,
        } = self;
        let ready = ops::all([store::readiness(pool.clone()), bus::readiness(js.client())]);
        let created = Arc::new(Notify::new());
        let ship = Arc::new(ShipOrders {
            created: created.clone(),
        });
        App::new()
            .ops(listener, ready)
            .task("consumer", |stop| {
                bus::consumer::run(
                    js,
                    // A shipment per order, by its unique order id: a second
                    // delivery finds it made, so no inbox row is needed.
                    PgInbox::without_rows(pool.clone()),
                    consumer_spec(batching),
                    ship,
                    stop,
                )
            })
            .task("warehouse", |stop| advance(pool, step_delay, created, stop))
            .run_until(shutdown)
            .await?;
        Ok(())
    }
}

/// The warehouse loop: moves due shipments on, then waits until the next
/// one falls due (never sooner than a quarter of a step after the last
/// look, at least 10 ms, so shipments due close together move together;
/// a commit that created shipments brings that time forward to their first
/// step), or at most [`IDLE_LOOK`]. It used to look every quarter step
/// whatever was open: 20 looks a second, each a transaction, in a warehouse
/// with nothing to ship.
async fn advance(
    pool: PgPool,
    step_delay: Duration,
    created: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let tick = (step_delay / 4).max(Duration::from_millis(10));
    let mut counted: Option<tokio::time::Instant> = None;
    let mut swept: Option<tokio::time::Instant> = None;
    loop {
        if counted.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
            count_findings(&pool).await;
            counted = Some(tokio::time::Instant::now());
        }
        metrics::counter!("soldonce_warehouse_looks_total").increment(1);
        let (shipped, next_due) =
            match store::shipments::advance_due(&pool, step_delay, 500, "fulfillment").await {
                Ok(advanced) => {
                    metrics::counter!("soldonce_shipment_steps_total").increment(advanced.steps);
                    (advanced.shipped, advanced.next_due)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "advancing shipments failed; retrying");
                    (Vec::new(), Some(tick))
                }
            };
        // An authorized order whose goods left is captured: decided here as its shipment
        // ships, carried out by the payment worker. The sweep, seldom, finds what that
        // missed (a crash between the two transactions), so nothing is lost.
        decide_captures(store::captures::decide_for(&pool, &shipped, "fulfillment").await);
        if swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
            decide_captures(store::captures::decide_shipped(&pool, 500, "fulfillment").await);
            swept = Some(tokio::time::Instant::now());
        }
        let wait = next_due.unwrap_or(IDLE_LOOK).min(IDLE_LOOK).max(tick);
        let mut until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep_until(until) => break,
                // Shipments just created fall due a step from now.
                () = created.notified() => {
                    until = until.min(tokio::time::Instant::now() + step_delay.max(tick));
                }
            }
        }
    }
}

/// The longest the warehouse loop waits between looks: a shipment it
/// cannot know the time of (created by another fulfillment process, or
/// one whose dispute hold was released) moves on within this of falling due.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// Counts the captures one decision made, or says why it failed.
fn decide_captures(decided: Result<usize, store::StoreError>) {
    match decided {
        Ok(n) => metrics::counter!("soldonce_captures_decided_total").increment(n as u64),
        Err(e) => tracing::warn!(error = %e, "deciding captures failed; retrying"),
    }
}

/// How often the capture sweep looks for shipped orders whose capture was
/// not decided as they shipped. It walks every authorized order, so not on
/// every tick: with 100,000 orders waiting to ship it took 13 ms.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How often the findings and held shipments are counted for the gauges.
const COUNT_EVERY: Duration = Duration::from_secs(5);

/// Sets the gauges of open findings (disputes a person must answer) and of
/// shipments a dispute holds.
async fn count_findings(pool: &PgPool) {
    match store::findings::open_counts(pool).await {
        Ok((open, held)) => {
            for (kind, n) in open {
                metrics::gauge!("soldonce_findings_open", "kind" => kind).set(n as f64);
            }
            metrics::gauge!("soldonce_shipments_held").set(held as f64);
        }
        Err(e) => tracing::warn!(error = %e, "counting findings failed; retrying"),
    }
}
