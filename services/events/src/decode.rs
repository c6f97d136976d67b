//! Typed decoding of a delivered event: one way for every consumer to learn
//! which aggregate an event is about and what happened to it.

use crate::envelope::CloudEvent;
use crate::names;
use domain::shipment::ShipmentEvent;
use uuid::Uuid;

/// A delivered event, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// Something that happened to an order (the envelope's subject).
    Order {
        order_id: Uuid,
        event: domain::Event,
    },
    /// A step of a shipment.
    Shipment(ShipmentEvent),
}

impl Decoded {
    /// The order the event is about, whichever aggregate recorded it.
    pub fn order_id(&self) -> Uuid {
        match self {
            Decoded::Order { order_id, .. } => *order_id,
            Decoded::Shipment(s) => s.order_id,
        }
    }
}

/// Why a delivered event does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0} is not a soldonce event type")]
    UnknownType(String),
    #[error("subject {0:?} is not an aggregate id")]
    Subject(String),
    #[error("{event_type}: {reason}")]
    Data { event_type: String, reason: String },
}

/// Decodes `event` into what happened, checking that the data matches its
/// type and the subject names the aggregate.
pub fn decode(event: &CloudEvent) -> Result<Decoded, DecodeError> {
    let type_name = names::type_name(&event.event_type)
        .ok_or_else(|| DecodeError::UnknownType(event.event_type.clone()))?;
    let subject: Uuid = event
        .subject
        .parse()
        .map_err(|_| DecodeError::Subject(event.subject.clone()))?;
    let data_error = |reason: String| DecodeError::Data {
        event_type: event.event_type.clone(),
        reason,
    };
    if names::stem(type_name).starts_with("shipment.") {
        let shipment: ShipmentEvent =
            serde_json::from_value(event.data.clone()).map_err(|e| data_error(e.to_string()))?;
        if shipment.state.event_type() != type_name || shipment.shipment_id != subject {
            return Err(data_error(
                "the data does not match the type and subject".into(),
            ));
        }
        return Ok(Decoded::Shipment(shipment));
    }
    if !names::stem(type_name).starts_with("order.") {
        return Err(DecodeError::UnknownType(event.event_type.clone()));
    }
    let decoded = domain::Event::from_parts(type_name, event.data.clone())
        .map_err(|e| data_error(e.to_string()))?;
    Ok(Decoded::Order {
        order_id: subject,
        event: decoded,
    })
}
