//! Folding the stream's events into orders and shipments in the order the
//! authority recorded them. The stream is nearly in that order, but not
//! always: events the relay republished after a broker lost them arrive
//! after younger events of the same order. Each message carries its
//! event's position (`Soldonce-Position`); an order that receives an event
//! older than one already folded is marked, and refolded from its events in
//! position order in a second pass over the stream, so memory holds only
//! the events of those orders. A shipment's state is its latest event's, so
//! the event with the highest position wins.

use crate::schemas::Schemas;
use events::CloudEvent;
use std::collections::{BTreeMap, HashMap, HashSet};
use uuid::Uuid;

/// What the stream folds into.
#[derive(Default)]
pub struct Fold {
    /// Only this order's events (and its shipment's), when set.
    only: Option<Uuid>,
    pub orders: HashMap<Uuid, Option<domain::Order>>,
    /// Each shipment's latest event, with its position.
    pub shipments: BTreeMap<Uuid, (i64, domain::shipment::ShipmentEvent)>,
    /// The position of the last event folded into each order.
    last: HashMap<Uuid, i64>,
    /// Orders that received an event older than one already folded.
    pub disordered: HashSet<Uuid>,
    /// Events the stream holds that do not validate, by stream sequence.
    pub invalid: Vec<String>,
}

/// One message's event, decoded and validated.
pub enum Decoded {
    Order(Uuid, domain::Event),
    Shipment(domain::shipment::ShipmentEvent),
}

/// Validates `payload` against the schemas and decodes it.
pub fn decode(schemas: &Schemas, payload: &[u8]) -> Result<Decoded, String> {
    let event: CloudEvent = serde_json::from_slice::<serde_json::Value>(payload)
        .map_err(|e| format!("not JSON: {e}"))
        .and_then(|v| schemas.check(&v).map(|()| v))
        .and_then(|v| {
            serde_json::from_value(v).map_err(|e| format!("not a soldonce envelope: {e}"))
        })?;
    match events::decode(&event).map_err(|e| e.to_string())? {
        events::Decoded::Shipment(s) => Ok(Decoded::Shipment(s)),
        events::Decoded::Order { order_id, event } => Ok(Decoded::Order(order_id, event)),
    }
}

impl Fold {
    pub fn new(only: Option<Uuid>) -> Self {
        Fold {
            only,
            ..Fold::default()
        }
    }

    /// Folds the message at stream sequence `seq`; `position` is its
    /// event's (absent on messages sent before the relay stamped them:
    /// those are taken in stream order).
    pub fn add(&mut self, schemas: &Schemas, seq: u64, position: Option<i64>, payload: &[u8]) {
        let decoded = match decode(schemas, payload) {
            Ok(d) => d,
            Err(why) => return self.invalid.push(format!("stream sequence {seq}: {why}")),
        };
        let position = position.unwrap_or(i64::MAX);
        match decoded {
            Decoded::Shipment(s) => {
                if self.only.is_none_or(|o| o == s.order_id) {
                    let newer = self
                        .shipments
                        .get(&s.shipment_id)
                        .is_none_or(|(p, _)| position == i64::MAX || *p <= position);
                    if newer {
                        self.shipments.insert(s.shipment_id, (position, s));
                    }
                }
            }
            Decoded::Order(order_id, event) => {
                if self.only.is_some_and(|o| o != order_id) {
                    return;
                }
                let last = self.last.entry(order_id).or_insert(i64::MIN);
                if position != i64::MAX && position < *last {
                    self.disordered.insert(order_id);
                }
                *last = (*last).max(position);
                let state = self.orders.entry(order_id).or_default();
                *state = domain::evolve(state.take(), &event);
            }
        }
    }

    /// Refolds the disordered orders from `events` (each one's, from a
    /// second pass over the stream), in position order.
    pub fn refold(&mut self, mut events: Vec<(i64, Uuid, domain::Event)>) {
        events.sort_by_key(|(position, _, _)| *position);
        for id in &self.disordered {
            self.orders.insert(*id, None);
        }
        for (_, order_id, event) in events {
            let state = self.orders.entry(order_id).or_default();
            *state = domain::evolve(state.take(), &event);
        }
    }
}
