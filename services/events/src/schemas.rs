//! The JSON Schemas of `proto/events/`, embedded: the published contract of
//! every event type, by type name.

/// Each event type's JSON Schema text, by type name (`order.placed.v1`).
pub const SCHEMAS: &[(&str, &str)] = &[
    (
        "order.placed.v1",
        include_str!("../../../proto/events/order.placed.v1.schema.json"),
    ),
    (
        "order.confirmed.v1",
        include_str!("../../../proto/events/order.confirmed.v1.schema.json"),
    ),
    (
        "order.payment_failed.v1",
        include_str!("../../../proto/events/order.payment_failed.v1.schema.json"),
    ),
    (
        "order.cancelled.v1",
        include_str!("../../../proto/events/order.cancelled.v1.schema.json"),
    ),
    (
        "order.expired.v1",
        include_str!("../../../proto/events/order.expired.v1.schema.json"),
    ),
    (
        "order.refund_decided.v1",
        include_str!("../../../proto/events/order.refund_decided.v1.schema.json"),
    ),
    (
        "order.refunded.v1",
        include_str!("../../../proto/events/order.refunded.v1.schema.json"),
    ),
    (
        "order.capture_decided.v1",
        include_str!("../../../proto/events/order.capture_decided.v1.schema.json"),
    ),
    (
        "order.captured.v1",
        include_str!("../../../proto/events/order.captured.v1.schema.json"),
    ),
    (
        "order.operator_refund_decided.v1",
        include_str!("../../../proto/events/order.operator_refund_decided.v1.schema.json"),
    ),
    (
        "order.operator_refunded.v1",
        include_str!("../../../proto/events/order.operator_refunded.v1.schema.json"),
    ),
    (
        "order.action_required.v1",
        include_str!("../../../proto/events/order.action_required.v1.schema.json"),
    ),
    (
        "order.disputed.v1",
        include_str!("../../../proto/events/order.disputed.v1.schema.json"),
    ),
    (
        "order.refunded_elsewhere.v1",
        include_str!("../../../proto/events/order.refunded_elsewhere.v1.schema.json"),
    ),
    (
        "order.operator_cancelled.v1",
        include_str!("../../../proto/events/order.operator_cancelled.v1.schema.json"),
    ),
    (
        "shipment.created.v1",
        include_str!("../../../proto/events/shipment.created.v1.schema.json"),
    ),
    (
        "shipment.picked.v1",
        include_str!("../../../proto/events/shipment.picked.v1.schema.json"),
    ),
    (
        "shipment.shipped.v1",
        include_str!("../../../proto/events/shipment.shipped.v1.schema.json"),
    ),
    (
        "shipment.delivered.v1",
        include_str!("../../../proto/events/shipment.delivered.v1.schema.json"),
    ),
    (
        "shipment.cancelled.v1",
        include_str!("../../../proto/events/shipment.cancelled.v1.schema.json"),
    ),
];

/// The schema text of a type name, if it has one.
pub fn schema(type_name: &str) -> Option<&'static str> {
    SCHEMAS
        .iter()
        .find(|(t, _)| *t == type_name)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_json_and_names_its_own_type() {
        for (type_name, text) in SCHEMAS {
            let schema: serde_json::Value = serde_json::from_str(text).expect("schema is JSON");
            let described = schema.to_string();
            assert!(
                described.contains(&crate::names::event_type(type_name)),
                "{type_name}'s schema does not mention its CloudEvents type"
            );
        }
    }
}
