//! psp-sim: a fake payment service provider for soldonce's tests and demos. It is a real HTTP
//! server with its own books, speaking the vocabulary of Stripe's PaymentIntents: a payment is
//! `requires_action` (the buyer's 3-D Secure step, at `next_action.url`), `processing`,
//! `requires_capture` (authorized with `capture_method: manual`), `succeeded`, `canceled` or
//! `failed`. Idempotent payments, refunds, captures (full or partial) and cancels; the
//! simulated buyer's `/action`; admin disputes that take captured money back; lookups by key
//! and by reference, paged listings by creation time for reconciliation (`GET /v1/payments`,
//! `GET /v1/refunds`); Standard Webhooks-signed webhooks, one per new status
//! (`payment.requires_action`, `payment.requires_capture`, `payment.succeeded`,
//! `payment.canceled`, `payment.failed`) plus `refund.succeeded` and `dispute.created`, retried
//! until acknowledged; and fault knobs (declines, payments that stay `processing` for a while,
//! payments that need the buyer, authorizations that lapse, latency, 503s, lost replies,
//! dropped, duplicated, delayed and reordered webhooks) set from `PSP_FAULTS` or
//! `PUT /admin/faults`. Like the provider it stands in for, it is never kinder: a change the
//! payment's status does not allow is a 409 naming that status. Its wire contract is
//! `proto/psp-sim.openapi.yaml`.
//!
//! The books live in memory, and with `PSP_SIM_DATA_DIR` also in a journal there
//! (`ledger.jsonl`): every change is appended before it is answered and replayed at start,
//! so the books (not pending webhooks) survive a restart or a kill; the timers (settling
//! `processing` payments, lapsing authorizations) are re-armed from the books at start. See
//! [`ledger`].
//!
//! It stands in for another company's system, so it must never depend on soldonce's crates
//! that know orders, stock or payments (`domain`, `events`, `store`, `bus`, `payments`, any
//! service): only on `platform`, the runtime any HTTP service could share (configuration,
//! telemetry and traces, the run of a program, problem responses); `scripts/lint.sh` checks
//! it. It never persists anything outside its own data directory, and is never pointed at
//! real money: it charges nothing.
//!
//! Layout:
//! - `lib.rs`, `settings.rs` — the server and its settings
//! - `http/` — the API: payments, refunds, capture and cancel, the buyer's action, listings,
//!   admin (faults, disputes), ops; `http/changes.rs` counts and announces each change
//! - `ledger/` — the books (`rules.rs`: which change each status allows; `lifecycle.rs`:
//!   the changes after creation) and their journal on disk
//! - `model/` — payments, refunds, disputes and the requests' bodies
//! - `settlement.rs` — the timers: settling `processing` payments, lapsing authorizations
//! - `faults.rs` — the fault knobs
//! - `webhook/` — signed webhooks, delivered with retries
//! - `signature.rs` — Standard Webhooks signatures
//! - `counters.rs`, `problem.rs` — what it counts, its problem responses

pub mod counters;
pub mod faults;
mod http;
pub mod ledger;
pub mod model;
pub mod problem;
pub mod settings;
mod settlement;
pub mod signature;
pub mod webhook;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use faults::Faults;
pub use settings::{Settings, SettingsError, WebhookTarget};

use counters::Counters;
use faults::FaultSwitch;
use ledger::{JournalError, Ledger};
use settlement::{Job, SettlementQueue, Settler};
use webhook::{Deliverer, Dispatcher, WebhookQueue};

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The listening address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// The webhook client could not be built.
    #[error(transparent)]
    WebhookClient(#[from] webhook::BuildClientError),
    /// The journal in `PSP_SIM_DATA_DIR` could not be opened or replayed.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// A bound, ready-to-run simulator.
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
    dispatcher: Option<Dispatcher>,
    settler: Settler,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

impl Application {
    /// Replays the journal (if any), binds the listener and wires state; nothing is served
    /// (and nothing settles) until [`Self::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Self, BuildError> {
        let mut ledger = match &settings.data_dir {
            Some(dir) => Ledger::open(dir)?,
            None => Ledger::default(),
        };
        let addr = settings.addr;
        let bind_error = |source| BuildError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;

        let counters = Arc::new(Counters::default());
        let faults = Arc::new(FaultSwitch::new(settings.faults));
        let (stop, stopped) = watch::channel(false);
        let (queue, dispatcher) = match settings.webhook {
            Some(target) => {
                let deliverer = Deliverer::new(target, Arc::clone(&counters))?;
                let (queue, events) = WebhookQueue::channel();
                let dispatcher = Dispatcher::new(
                    events,
                    deliverer,
                    Arc::clone(&faults),
                    Arc::clone(&counters),
                    stopped.clone(),
                );
                (queue, Some(dispatcher))
            }
            None => (WebhookQueue::disabled(), None),
        };
        let public_url = match &settings.public_url {
            Some(url) => url.to_string(),
            None => format!("http://{local_addr}"),
        };
        ledger.set_public_url(&public_url);
        let (settlements, due) = SettlementQueue::channel();
        schedule_replayed(&ledger, &faults.current(), &settlements);
        let state = Arc::new(http::AppState::new(
            ledger,
            faults,
            Arc::clone(&counters),
            queue,
            settlements,
            stopped.clone(),
        ));
        let settler = Settler::new(
            due,
            stopped,
            Box::new({
                let state = Arc::clone(&state);
                move |job| http::run_job(&state, job)
            }),
        );
        Ok(Self {
            listener,
            local_addr,
            router: http::router(state),
            dispatcher,
            settler,
            stop,
            counters,
        })
    }

    /// The bound port (useful when `PSP_SIM_ADDR` asked for port 0).
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` resolves, then stops accepting, releases held replies, stops the
    /// webhook dispatcher (abandoning pending retries) and the settlement timer (payments still
    /// processing stay so), and waits for in-flight requests.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let dispatcher = self.dispatcher.map(|d| tokio::spawn(d.run()));
        let settler = tokio::spawn(self.settler.run());
        let stop = self.stop;
        let signal = async move {
            shutdown.await;
            tracing::info!("psp-sim stopping");
            stop.send_replace(true);
        };
        // If serving fails, dropping `signal` drops the sender, which stops the dispatcher too.
        let counters = self.counters;
        let listener = self
            .listener
            .tap_io(move |_| counters.connection_accepted());
        let served = axum::serve(listener, self.router)
            .with_graceful_shutdown(signal)
            .await;
        if let Some(dispatcher) = dispatcher {
            if let Err(error) = dispatcher.await {
                tracing::error!(%error, "webhook dispatcher ended abnormally");
            }
        }
        if let Err(error) = settler.await {
            tracing::error!(%error, "settlement timer ended abnormally");
        }
        served
    }
}

/// Arms the timers of the books as replayed: payments still `processing` settle
/// `processing_ms` after this start; authorizations lapse `authorization_ttl_ms` after they
/// were given (at once if that is past), when that knob is set at this start.
fn schedule_replayed(ledger: &Ledger, faults: &Faults, settlements: &SettlementQueue) {
    let processing = Duration::from_millis(faults.processing_ms);
    for payment_id in ledger.unsettled() {
        settlements.schedule(Job::Settle(payment_id), processing);
    }
    if faults.authorization_ttl_ms == 0 {
        return;
    }
    let ttl = chrono::TimeDelta::milliseconds(
        i64::try_from(faults.authorization_ttl_ms).unwrap_or(i64::MAX),
    );
    let now = chrono::Utc::now();
    for (payment_id, authorized_at) in ledger.awaiting_capture() {
        let left = (authorized_at + ttl - now)
            .to_std()
            .unwrap_or(Duration::ZERO);
        settlements.schedule(Job::Expire(payment_id), left);
    }
}
