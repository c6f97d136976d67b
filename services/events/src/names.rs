//! How events are named on the wire: the `soldonce.` prefix, versioned type
//! names (`order.placed.v1`) and the subjects they travel on
//! (`soldonce.order.placed.<aggregate id>`). Every spelling lives here.

use uuid::Uuid;

/// The prefix of every subject and CloudEvents type.
pub const PREFIX: &str = "soldonce";

/// Every subject soldonce publishes on (the stream's filter).
pub const ALL_SUBJECTS: &str = "soldonce.>";

/// The CloudEvents `type` of a type name: `soldonce.order.placed.v1`.
pub fn event_type(type_name: &str) -> String {
    format!("{PREFIX}.{type_name}")
}

/// The type name of a CloudEvents `type`, if it is one of soldonce's:
/// `order.placed.v1` for `soldonce.order.placed.v1`.
pub fn type_name(event_type: &str) -> Option<&str> {
    event_type
        .strip_prefix(PREFIX)
        .and_then(|t| t.strip_prefix('.'))
}

/// A type name without its version: `order.placed` for `order.placed.v1`
/// (any version, `.v2` included); a name without a version is its own stem.
pub fn stem(type_name: &str) -> &str {
    match type_name.rsplit_once('.') {
        Some((stem, v))
            if v.len() > 1 && v.starts_with('v') && v[1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            stem
        }
        _ => type_name,
    }
}

/// The subject an event of `type_name` about aggregate `id` travels on:
/// `soldonce.order.placed.<id>` (versions share a subject).
pub fn subject(type_name: &str, id: Uuid) -> String {
    format!("{PREFIX}.{}.{id}", stem(type_name))
}

/// The subjects of every version of one kind of event, for a consumer's
/// filter: `soldonce.order.placed.>`.
pub fn subjects_of(type_name: &str) -> String {
    format!("{PREFIX}.{}.>", stem(type_name))
}

/// The CloudEvents `source` of what `service` recorded: `soldonce/checkout`.
pub fn source(service: &str) -> String {
    format!("{PREFIX}/{service}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_versions_share_a_subject() {
        let id = Uuid::nil();
        assert_eq!(event_type("order.placed.v1"), "soldonce.order.placed.v1");
        assert_eq!(
            type_name("soldonce.order.placed.v1"),
            Some("order.placed.v1")
        );
        assert_eq!(type_name("soldonceX.order.placed.v1"), None);
        assert_eq!(type_name("other.order.placed.v1"), None);
        assert_eq!(
            subject("shipment.picked.v1", id),
            subject("shipment.picked.v2", id)
        );
        assert_eq!(
            subject("order.placed.v12", id),
            format!("soldonce.order.placed.{id}")
        );
        assert_eq!(stem("order.placed"), "order.placed");
        assert_eq!(stem("order.placed.vx"), "order.placed.vx");
        assert_eq!(
            subjects_of("order.confirmed.v1"),
            "soldonce.order.confirmed.>"
        );
    }
}
