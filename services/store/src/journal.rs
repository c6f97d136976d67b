//! The event store proper: every recorded event of every aggregate, with
//! the outbox row of the statement that appends them, set-based (two
//! fragments of the write path's one statement). An event is written once:
//! its outbox row only names it by position, which the relay reads it by and stamps on the message, so
//! the stream can be checked against `events` and repaired from it. A version already taken in a stream turns into
//! `StoreError::Conflict`.

use crate::statement::Statement;
use crate::StoreError;
use chrono::{DateTime, Utc};
use events::Metadata;
use uuid::Uuid;

/// One event to record, of any aggregate, at its version of its stream.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub stream_id: Uuid,
    pub version: i32,
    pub type_name: &'static str,
    pub data: serde_json::Value,
    pub at: DateTime<Utc>,
    pub meta: Metadata,
}

impl Record {
    /// An order event.
    pub(crate) fn order(order_id: Uuid, version: i32, e: &domain::Event, meta: &Metadata) -> Self {
        Record {
            stream_id: order_id,
            version,
            type_name: e.type_name(),
            data: e.data(),
            at: e.at(),
            meta: meta.clone(),
        }
    }

    /// A shipment event.
    pub(crate) fn shipment(
        e: &domain::shipment::ShipmentEvent,
        version: i32,
        meta: &Metadata,
    ) -> Result<Self, StoreError> {
        Ok(Record {
            stream_id: e.shipment_id,
            version,
            type_name: e.state.event_type(),
            data: serde_json::to_value(e).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            at: e.at,
            meta: meta.clone(),
        })
    }
}

/// Appends records (of one or many streams) with their outbox row, as
/// fragments of `statement`: a row per 32 of them, naming each event by
/// position (see [`crate::outbox::QUEUE_SQL`]); the relay reads the events
/// (their streams and versions too, for the per-order order) and builds the
/// messages from them. An
/// event's data is sent and stored as the JSON text serialized here
/// (`json`, not `jsonb`: see the `events_as_written` migration), which
/// PostgreSQL only checks; its metadata as typed columns (see the
/// `event_metadata_as_columns` migration).
pub(crate) fn append<'q>(
    statement: &mut Statement<'q>,
    records: &'q [Record],
) -> Result<(), StoreError> {
    let Some(first) = records.first() else {
        return Ok(());
    };
    let n = records.len();
    let (mut ids, mut streams, mut versions, mut types) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut datas, mut times) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut correlations, mut causes, mut sources) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut parents, mut states) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    for r in records {
        ids.push(Uuid::now_v7());
        streams.push(r.stream_id);
        versions.push(r.version);
        types.push(r.type_name);
        datas.push(serde_json::to_string(&r.data).map_err(corrupt)?);
        times.push(r.at);
        correlations.push(r.meta.correlation_id);
        causes.push(r.meta.causation_id);
        sources.push(r.meta.source.as_str());
        parents.push(r.meta.traceparent.as_deref());
        states.push(r.meta.tracestate.as_deref());
    }
    let s = statement;
    let (ids, streams) = (s.bind(ids)?, s.bind(streams)?);
    let (versions, types, datas) = (s.bind(versions)?, s.bind(types)?, s.bind(datas)?);
    let (correlations, causes) = (s.bind(correlations)?, s.bind(causes)?);
    let (sources, parents, states) = (s.bind(sources)?, s.bind(parents)?, s.bind(states)?);
    let times = s.bind(times)?;
    s.cte(
        "appended",
        &format!(
            "INSERT INTO events (event_id, stream_id, version, type, data, recorded_at, \
                                 correlation_id, causation_id, source, traceparent, tracestate) \
             SELECT * FROM unnest({ids}::uuid[], {streams}::uuid[], {versions}::int[], {types}::text[], {datas}::text[]::json[], {times}::timestamptz[], \
                                  {correlations}::uuid[], {causes}::uuid[], {sources}::text[], {parents}::text[], {states}::text[]) \
             RETURNING position, xmin"
        ),
    );
    s.cte("queued", crate::outbox::QUEUE_SQL);
    s.expect_rows("appended", n, first.stream_id);
    s.expect_rows(
        "queued",
        n.div_ceil(crate::outbox::EVENTS_PER_ROW),
        first.stream_id,
    );
    s.on_taken("events_stream_version", first.stream_id);
    Ok(())
}
