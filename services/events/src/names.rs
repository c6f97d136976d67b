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

/// The token after the prefix that redriven messages travel under.
const REDRIVE: &str = "redrive";

/// Whether `name` can stand as one subject token (a consumer's durable
/// name must): not empty, no `.`, `*`, `>` or whitespace.
pub fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| !c.is_whitespace() && !matches!(c, '.' | '*' | '>'))
}

/// The subjects `consumer` reads redriven messages on, beside its own
/// filter: `soldonce.redrive.<consumer>.>`. Only that consumer reads them,
/// so a redrive reaches the consumer that gave up on a message and no other.
pub fn redrive_subjects(consumer: &str) -> String {
    format!("{PREFIX}.{REDRIVE}.{consumer}.>")
}

/// The subject a message that `consumer` dead-lettered on `subject` is
/// redriven on: `soldonce.redrive.<consumer>.order.placed.<id>` for
/// `soldonce.order.placed.<id>` (a message redriven before is redriven on
/// its first subject's). `None` when `consumer` is not a token or the
/// subject is not a soldonce subject.
pub fn redrive_subject(consumer: &str, subject: &str) -> Option<String> {
    let original = original_subject(subject);
    let rest = original.strip_prefix(PREFIX)?.strip_prefix('.')?;
    (is_token(consumer) && !rest.is_empty())
        .then(|| format!("{PREFIX}.{REDRIVE}.{consumer}.{rest}"))
}

/// The subject a message was first published on: `subject` itself, or the
/// one a redrive subject wraps.
pub fn original_subject(subject: &str) -> String {
    let redriven = subject
        .strip_prefix(PREFIX)
        .and_then(|s| s.strip_prefix('.'))
        .and_then(|s| s.strip_prefix(REDRIVE))
        .and_then(|s| s.strip_prefix('.'))
        .and_then(|s| s.split_once('.'))
        .map(|(_consumer, rest)| rest);
    match redriven {
        Some(rest) => format!("{PREFIX}.{rest}"),
        None => subject.to_owned(),
    }
}

/// Whether a message on `subject` is a redrive (a copy of a message for
/// one consumer), not an event's publication: readers of the whole stream
/// (replay, `events tail`, the stream's audit) pass over it.
pub fn is_redrive(subject: &str) -> bool {
    subject.starts_with(&format!("{PREFIX}.{REDRIVE}."))
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

    #[test]
    fn a_redrive_travels_to_one_consumer_and_names_its_first_subject() {
        let first = "soldonce.order.placed.42";
        let redrive = redrive_subject("payment-worker", first).expect("a subject");
        assert_eq!(redrive, "soldonce.redrive.payment-worker.order.placed.42");
        assert!(is_redrive(&redrive) && !is_redrive(first));
        assert_eq!(original_subject(&redrive), first);
        assert_eq!(original_subject(first), first);
        assert_eq!(
            redrive_subject("payment-worker", &redrive).as_deref(),
            Some(redrive.as_str()),
            "a redrive of a redrive is the same subject"
        );
        assert_eq!(
            redrive_subjects("payment-worker"),
            "soldonce.redrive.payment-worker.>"
        );
        assert_eq!(redrive_subject("a.b", first), None);
        assert_eq!(redrive_subject("c", "elsewhere.x"), None);
        assert!(!is_token("") && !is_token("a b") && !is_token("a>") && is_token("fulfillment"));
    }
}
