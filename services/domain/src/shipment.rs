//! A shipment's lifecycle in a simulated warehouse: created `pending` for a
//! confirmed order, then `picked`, `shipped`, `delivered`, one step at a time.

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
}

impl ShipmentState {
    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            ShipmentState::Pending => "pending",
            ShipmentState::Picked => "picked",
            ShipmentState::Shipped => "shipped",
            ShipmentState::Delivered => "delivered",
        }
    }

    /// Parses a column value.
    pub fn parse(s: &str) -> Option<Self> {
        [
            ShipmentState::Pending,
            ShipmentState::Picked,
            ShipmentState::Shipped,
            ShipmentState::Delivered,
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
            ShipmentState::Delivered => None,
        }
    }

    /// The event that records reaching this state, e.g. `shipment.picked.v1`.
    pub fn event_type(self) -> &'static str {
        match self {
            ShipmentState::Pending => "shipment.created.v1",
            ShipmentState::Picked => "shipment.picked.v1",
            ShipmentState::Shipped => "shipment.shipped.v1",
            ShipmentState::Delivered => "shipment.delivered.v1",
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
