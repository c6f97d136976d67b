//! The event store proper: every recorded event of every aggregate, with
//! its outbox row, appended set-based in one statement. A version already
//! taken in a stream turns into `StoreError::Conflict`.

use crate::StoreError;
use chrono::{DateTime, Utc};
use events::{envelope, names, Metadata};
use sqlx::PgConnection;
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

/// Appends records (of one or many streams) with their outbox rows, in one
/// statement.
pub(crate) async fn append(conn: &mut PgConnection, records: &[Record]) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let n = records.len();
    let (mut ids, mut streams, mut versions, mut types, mut datas) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut times, mut metas, mut subjects, mut payloads, mut headers) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    for r in records {
        let id = Uuid::now_v7();
        let wrapped = envelope::wrap(id, r.stream_id, r.type_name, r.at, r.data.clone(), &r.meta);
        ids.push(id);
        streams.push(r.stream_id);
        versions.push(r.version);
        types.push(r.type_name);
        datas.push(r.data.clone());
        times.push(r.at);
        metas.push(serde_json::to_value(&r.meta).map_err(corrupt)?);
        subjects.push(names::subject(r.type_name, r.stream_id));
        payloads.push(serde_json::to_value(&wrapped).map_err(corrupt)?);
        headers.push(serde_json::json!({ "traceparent": r.meta.traceparent }));
    }
    let appended = sqlx::query(
        "WITH e AS (INSERT INTO events (event_id, stream_id, version, type, data, metadata, recorded_at) \
                    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::jsonb[], $6::jsonb[], $7::timestamptz[])) \
         INSERT INTO outbox (id, stream_id, subject, payload, headers) \
         SELECT * FROM unnest($1::uuid[], $2::uuid[], $8::text[], $9::jsonb[], $10::jsonb[])",
    )
    .bind(&ids)
    .bind(&streams)
    .bind(&versions)
    .bind(&types)
    .bind(&datas)
    .bind(&metas)
    .bind(&times)
    .bind(&subjects)
    .bind(&payloads)
    .bind(&headers)
    .execute(&mut *conn)
    .await;
    if let Err(e) = &appended {
        if crate::violated_constraint(e) == Some("events_stream_version") {
            return Err(StoreError::Conflict(
                streams.first().copied().unwrap_or_default(),
            ));
        }
    }
    appended?;
    Ok(())
}
