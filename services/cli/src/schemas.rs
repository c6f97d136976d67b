//! The event schemas of `proto/events/`, embedded, for validating what the
//! stream holds.

use std::collections::HashMap;

/// Each event type's JSON Schema text, by CloudEvents type.
const SCHEMAS: &[(&str, &str)] = &[
    (
        "soldonce.order.placed.v1",
        include_str!("../../../proto/events/order.placed.v1.schema.json"),
    ),
    (
        "soldonce.order.confirmed.v1",
        include_str!("../../../proto/events/order.confirmed.v1.schema.json"),
    ),
    (
        "soldonce.order.payment_failed.v1",
        include_str!("../../../proto/events/order.payment_failed.v1.schema.json"),
    ),
    (
        "soldonce.order.cancelled.v1",
        include_str!("../../../proto/events/order.cancelled.v1.schema.json"),
    ),
    (
        "soldonce.order.expired.v1",
        include_str!("../../../proto/events/order.expired.v1.schema.json"),
    ),
    (
        "soldonce.order.refund_decided.v1",
        include_str!("../../../proto/events/order.refund_decided.v1.schema.json"),
    ),
    (
        "soldonce.order.refunded.v1",
        include_str!("../../../proto/events/order.refunded.v1.schema.json"),
    ),
    (
        "soldonce.shipment.created.v1",
        include_str!("../../../proto/events/shipment.created.v1.schema.json"),
    ),
    (
        "soldonce.shipment.picked.v1",
        include_str!("../../../proto/events/shipment.picked.v1.schema.json"),
    ),
    (
        "soldonce.shipment.shipped.v1",
        include_str!("../../../proto/events/shipment.shipped.v1.schema.json"),
    ),
    (
        "soldonce.shipment.delivered.v1",
        include_str!("../../../proto/events/shipment.delivered.v1.schema.json"),
    ),
];

/// Compiled validators for every known event type.
pub struct Schemas(HashMap<&'static str, jsonschema::Validator>);

impl Schemas {
    /// Compiles the embedded schemas.
    pub fn load() -> anyhow::Result<Self> {
        let mut map = HashMap::new();
        for (ty, text) in SCHEMAS {
            let schema: serde_json::Value = serde_json::from_str(text)?;
            let validator = jsonschema::validator_for(&schema)
                .map_err(|e| anyhow::anyhow!("schema of {ty}: {e}"))?;
            map.insert(*ty, validator);
        }
        Ok(Schemas(map))
    }

    /// `Ok` if the message is a valid event of a known type, else why not.
    pub fn check(&self, event: &serde_json::Value) -> Result<(), String> {
        let ty = event
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or("no type attribute")?;
        let validator = self
            .0
            .get(ty)
            .ok_or_else(|| format!("unknown event type or version {ty}"))?;
        let errors: Vec<String> = validator
            .iter_errors(event)
            .take(3)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{ty} does not match its schema: {}",
                errors.join("; ")
            ))
        }
    }
}
