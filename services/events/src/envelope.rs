//! The CloudEvents 1.0 envelope every event travels in on the bus, and the
//! metadata stored beside each event (why it happened, who recorded it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why an event happened: the request or message that caused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Shared by every event of one saga (the order id's first request).
    pub correlation_id: Uuid,
    /// The event or request that directly caused this one.
    pub causation_id: Uuid,
    /// The service that recorded the event, e.g. `checkout`.
    pub source: String,
    /// W3C trace context, when the cause carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// W3C `tracestate` (vendors' entries), forwarded beside the traceparent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl Metadata {
    /// For what a request to `source` causes: the request starts (or
    /// continues, with its `correlation_id`) a saga; a fresh causation id
    /// stands for the request.
    pub fn from_request(
        source: &str,
        correlation_id: Uuid,
        traceparent: Option<String>,
    ) -> Metadata {
        Metadata {
            correlation_id,
            causation_id: Uuid::now_v7(),
            source: source.to_owned(),
            traceparent,
            tracestate: None,
        }
    }

    /// The same metadata, forwarding a W3C `tracestate` as well.
    pub fn with_tracestate(mut self, tracestate: Option<String>) -> Metadata {
        self.tracestate = tracestate;
        self
    }

    /// For what `source` records because it handled `cause`: the same saga,
    /// caused by that event, on the trace the event travelled with.
    pub fn caused_by(source: &str, cause: &CloudEvent, traceparent: Option<String>) -> Metadata {
        Metadata {
            correlation_id: cause.correlationid,
            causation_id: cause.id,
            source: source.to_owned(),
            traceparent,
            tracestate: None,
        }
    }

    /// For what `source` records on its own (a timer, a scan): no request
    /// or event caused it, so a fresh causation id stands for the decision.
    pub fn spontaneous(source: &str, correlation_id: Uuid) -> Metadata {
        Metadata::from_request(source, correlation_id, None)
    }
}

/// A CloudEvents 1.0 structured-mode JSON event. It decodes only from a
/// JSON object with exactly these members, `specversion` `1.0` and
/// `datacontenttype` `application/json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudEvent {
    pub specversion: String,
    pub id: Uuid,
    pub source: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub subject: String,
    pub time: DateTime<Utc>,
    pub datacontenttype: String,
    pub correlationid: Uuid,
    pub causationid: Uuid,
    pub data: serde_json::Value,
}

impl<'de> Deserialize<'de> for CloudEvent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // An object only (serde's derive would also take the ten values as
        // an array), and no member twice.
        let object = d.deserialize_map(UniqueMembers)?;
        let wire: WireEvent =
            serde_json::from_value(serde_json::Value::Object(object)).map_err(D::Error::custom)?;
        if wire.specversion != "1.0" || wire.datacontenttype != "application/json" {
            return Err(D::Error::custom(
                "specversion must be 1.0 and datacontenttype application/json",
            ));
        }
        let WireEvent {
            specversion,
            id,
            source,
            event_type,
            subject,
            time,
            datacontenttype,
            correlationid,
            causationid,
            data,
        } = wire;
        Ok(CloudEvent {
            specversion,
            id,
            source,
            event_type,
            subject,
            time,
            datacontenttype,
            correlationid,
            causationid,
            data,
        })
    }
}

/// Reads a JSON object, refusing a member that appears twice.
struct UniqueMembers;

impl<'de> serde::de::Visitor<'de> for UniqueMembers {
    type Value = serde_json::Map<String, serde_json::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a CloudEvents JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut access: A,
    ) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some((key, value)) = access.next_entry::<String, serde_json::Value>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate field `{key}`")));
            }
            object.insert(key, value);
        }
        Ok(object)
    }
}

/// The envelope's members as they travel.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEvent {
    specversion: String,
    id: Uuid,
    source: String,
    #[serde(rename = "type")]
    event_type: String,
    subject: String,
    time: DateTime<Utc>,
    datacontenttype: String,
    correlationid: Uuid,
    causationid: Uuid,
    data: serde_json::Value,
}

/// Wraps a recorded event for the bus: `type_name` like
/// `shipment.picked.v1`, `subject_id` its aggregate's id.
pub fn wrap(
    event_id: Uuid,
    subject_id: Uuid,
    type_name: &str,
    at: DateTime<Utc>,
    data: serde_json::Value,
    meta: &Metadata,
) -> CloudEvent {
    CloudEvent {
        specversion: "1.0".into(),
        id: event_id,
        source: crate::names::source(&meta.source),
        event_type: crate::names::event_type(type_name),
        subject: subject_id.to_string(),
        time: at,
        datacontenttype: "application/json".into(),
        correlationid: meta.correlation_id,
        causationid: meta.causation_id,
        data,
    }
}

/// Wraps a recorded order event for the bus.
pub fn wrap_order(
    event_id: Uuid,
    order_id: Uuid,
    event: &domain::Event,
    meta: &Metadata,
) -> CloudEvent {
    wrap(
        event_id,
        order_id,
        event.type_name(),
        event.at(),
        event.data(),
        meta,
    )
}
