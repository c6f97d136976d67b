//! Answering a POST that had an effect — or, under `lose_reply_rate`, never answering it.

use std::io;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::AppState;
use crate::counters::Fault;
use crate::faults::{roll, Faults};
use crate::ledger::Recorded;

/// How long a lost reply is held before the connection is cut.
const LOST_REPLY_HOLD: Duration = Duration::from_secs(60);

/// 201 for a new resource, 200 for a replay — unless the reply is lost on purpose.
pub(super) async fn recorded<T: Serialize>(
    state: &AppState,
    faults: &Faults,
    recorded: Recorded<T>,
) -> Response {
    answer(state, faults, recorded, StatusCode::CREATED).await
}

/// 200 for a change to an existing resource, new or replayed (as Stripe answers a capture or
/// a cancel) — unless the reply is lost on purpose.
pub(super) async fn changed<T: Serialize>(
    state: &AppState,
    faults: &Faults,
    recorded: Recorded<T>,
) -> Response {
    answer(state, faults, recorded, StatusCode::OK).await
}

async fn answer<T: Serialize>(
    state: &AppState,
    faults: &Faults,
    recorded: Recorded<T>,
    created: StatusCode,
) -> Response {
    if roll(faults.lose_reply_rate) {
        state.counters.fault_injected(Fault::LoseReply, 1);
        tracing::info!("reply lost on purpose; the effect stands");
        return lost_reply(state).await;
    }
    match recorded {
        Recorded::Created(resource) => (created, Json(resource)).into_response(),
        Recorded::Replayed(resource) => (StatusCode::OK, Json(resource)).into_response(),
    }
}

/// Holds the request until the hold runs out or the application stops (or hyper drops this
/// future with its connection), then cuts the connection without sending a status line: a body
/// that fails before its first byte makes hyper abort the connection with the head unsent.
async fn lost_reply(state: &AppState) -> Response {
    let mut stop = state.stop.clone();
    tokio::select! {
        () = tokio::time::sleep(LOST_REPLY_HOLD) => {}
        _ = stop.wait_for(|stopped| *stopped) => {}
    }
    let failing = futures::stream::once(async {
        Err::<Bytes, io::Error>(io::Error::other("reply lost on purpose"))
    });
    Response::new(Body::from_stream(failing))
}
