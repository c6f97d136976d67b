//! A shipment's lifecycle in a simulated warehouse: created `pending` for a
//! confirmed order, then `picked`, `shipped`, `delivered`, one step at a time;
//! `cancelled` (final) when an operator cancels its order before it ships.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where a shipment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShipmentState {
    Pending,
    Picked,
    Shipped,
    Delivered,
    Cancelled,
}

impl ShipmentState {
    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            ShipmentState::Pending => "pending",
            ShipmentState::Picked => "picked",
            ShipmentState::Shipped => "shipped",
            ShipmentState::Delivered => "delivered",
            ShipmentState::Cancelled => "cancelled",
        }
    }

    /// Parses a column value.
    pub fn parse(s: &str) -> Option<Self> {
        [
            ShipmentState::Pending,
            ShipmentState::Picked,
            ShipmentState::Shipped,
            ShipmentState::Delivered,
            ShipmentState::Cancelled,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }

    /// The step after this one, if any.
    pub fn next(self) -> Option<ShipmentState> {
        match self {
            ShipmentState::Pending => Some(ShipmentState::Picked),
            ShipmentState::Picked => Some(ShipmentState::Shipped),
            ShipmentState::Shipped => Some(ShipmentState::Delivered),
            ShipmentState::Delivered | ShipmentState::Cancelled => None,
        }
    }

    /// The event that records reaching this state, e.g. `shipment.picked.v1`.
    pub fn event_type(self) -> &'static str {
        match self {
            ShipmentState::Pending => "shipment.created.v1",
            ShipmentState::Picked => "shipment.picked.v1",
            ShipmentState::Shipped => "shipment.shipped.v1",
            ShipmentState::Delivered => "shipment.delivered.v1",
            ShipmentState::Cancelled => "shipment.cancelled.v1",
        }
    }

    /// Whether the goods have left the warehouse.
    pub fn has_left(self) -> bool {
        matches!(self, ShipmentState::Shipped | ShipmentState::Delivered)
    }
}

/// The payload of every shipment event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShipmentEvent {
    pub shipment_id: Uuid,
    pub order_id: Uuid,
    pub state: ShipmentState,
    pub at: DateTime<Utc>,
}

/// A shipment as its events leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    pub id: Uuid,
    pub order_id: Uuid,
    pub state: ShipmentState,
    /// Events in the shipment's stream.
    pub version: i32,
    pub updated_at: DateTime<Utc>,
}

/// What can be asked of a shipment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShipmentCommand {
    /// Create the shipment of a confirmed order.
    Create {
        shipment_id: Uuid,
        order_id: Uuid,
        at: DateTime<Utc>,
    },
    /// Move one step on.
    Advance { at: DateTime<Utc> },
    /// Stop it for good, unless it has left (its order was cancelled).
    Cancel { at: DateTime<Utc> },
}

/// Decides what a command records; nothing when it is already in effect
/// (a second create, an advance past delivered or of no shipment).
pub fn decide(current: Option<&Shipment>, command: ShipmentCommand) -> Vec<ShipmentEvent> {
    match (current, command) {
        (
            None,
            ShipmentCommand::Create {
                shipment_id,
                order_id,
                at,
            },
        ) => vec![ShipmentEvent {
            shipment_id,
            order_id,
            state: ShipmentState::Pending,
            at,
        }],
        (Some(s), ShipmentCommand::Advance { at }) => s
            .state
            .next()
            .map(|state| ShipmentEvent {
                shipment_id: s.id,
                order_id: s.order_id,
                state,
                at,
            })
            .into_iter()
            .collect(),
        (Some(s), ShipmentCommand::Cancel { at })
            if matches!(s.state, ShipmentState::Pending | ShipmentState::Picked) =>
        {
            vec![ShipmentEvent {
                shipment_id: s.id,
                order_id: s.order_id,
                state: ShipmentState::Cancelled,
                at,
            }]
        }
        (Some(_), ShipmentCommand::Create { .. } | ShipmentCommand::Cancel { .. })
        | (None, ShipmentCommand::Advance { .. } | ShipmentCommand::Cancel { .. }) => vec![],
    }
}

/// Folds one event into the shipment.
pub fn evolve(current: Option<Shipment>, event: &ShipmentEvent) -> Shipment {
    Shipment {
        id: event.shipment_id,
        order_id: event.order_id,
        state: event.state,
        version: current.map_or(1, |s| s.version + 1),
        updated_at: event.at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipment_is_created_once_and_advanced_to_delivered() {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let (id, order_id) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let create = ShipmentCommand::Create {
            shipment_id: id,
            order_id,
            at,
        };
        assert!(decide(None, ShipmentCommand::Advance { at }).is_empty());
        let mut shipment: Option<Shipment> = None;
        for e in decide(None, create.clone()) {
            shipment = Some(evolve(shipment, &e));
        }
        let created = shipment.clone().expect("created");
        assert_eq!(
            (created.state, created.version),
            (ShipmentState::Pending, 1)
        );
        assert!(decide(Some(&created), create).is_empty());
        loop {
            let current = shipment.clone().expect("shipment");
            let events = decide(Some(&current), ShipmentCommand::Advance { at });
            if events.is_empty() {
                break;
            }
            shipment = Some(evolve(Some(current), &events[0]));
        }
        let done = shipment.expect("shipment");
        assert_eq!((done.state, done.version), (ShipmentState::Delivered, 4));
    }

    #[test]
    fn a_shipment_moves_forward_one_step_at_a_time_and_stops_when_delivered() {
        let mut state = ShipmentState::Pending;
        let mut seen = vec![state];
        while let Some(next) = state.next() {
            state = next;
            seen.push(state);
        }
        assert_eq!(
            seen,
            [
                ShipmentState::Pending,
                ShipmentState::Picked,
                ShipmentState::Shipped,
                ShipmentState::Delivered
            ]
        );
        assert_eq!(
            ShipmentState::parse("shipped"),
            Some(ShipmentState::Shipped)
        );
        assert_eq!(ShipmentState::parse("lost"), None);
        assert_eq!(
            ShipmentState::Delivered.event_type(),
            "shipment.delivered.v1"
        );
    }
}
