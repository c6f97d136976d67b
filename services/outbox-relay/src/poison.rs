//! Which publish failures no retry can fix. Such a row is parked with one of
//! [`REASONS`]; every other failure is retried.
//!
//! Poison is a property of the message, never of the connection or the
//! stream: a timeout, a lost connection, "no responders" (the stream is
//! missing) and JetStream's refusals that would hit any message (storage or
//! account limits full, no leader, a sealed stream, a code this relay does
//! not know) are retried, because parking on them would empty the whole
//! outbox into `outbox_parked` during an outage.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::ErrorCode;

/// The message (headers plus payload) exceeds the server's `max_payload` or the stream's `max_msg_size`.
pub const TOO_LARGE: &str = "too_large";
/// The subject is not one the stream takes (`soldonce.>`), or not a valid NATS subject.
pub const BAD_SUBJECT: &str = "bad_subject";
/// JetStream refused this message for a reason of its own (see `REJECTED_CODES`).
pub const REJECTED: &str = "rejected";
/// Every reason, for the `reason` label of `soldonce_outbox_parked_total`.
pub const REASONS: [&str; 3] = [TOO_LARGE, BAD_SUBJECT, REJECTED];

/// JetStream error codes meaning the message is too big for the stream.
const TOO_LARGE_CODES: &[u64] = &[
    10054, // message size exceeds maximum allowed (the stream's max_msg_size)
    10097, // header size exceeds maximum allowed
];

/// JetStream error codes that concern one message: sent again, the same
/// message is refused again. (They follow from headers the message carries;
/// the relay sets only `Nats-Msg-Id` and `traceparent`, so they are a guard.)
const REJECTED_CODES: &[u64] = &[
    10060, // expected stream does not match
    10063, // expected stream sequence does not match
    10070, // wrong last msg id
    10071, // wrong last sequence
    10165, // message TTL invalid
    10166, // message TTL disabled
    10168, 10169, 10170, 10171, 10172, // message counters
    10177, // atomic publish: unsupported header
    10188, 10189, 10190, 10191, 10192, // message schedules
    10193, // expected last sequence per subject invalid
    10203, 10212, 10223, // message schedules
];

/// Why one row can never be published.
#[derive(Debug, Clone)]
pub struct Poison {
    /// One of [`REASONS`].
    pub reason: &'static str,
    /// What the server or the check said, for the log line.
    pub detail: String,
}

impl Poison {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Self {
        Poison {
            reason,
            detail: detail.into(),
        }
    }
}

/// `Some` when `e` says this message can never be published; `None` when a
/// retry may succeed.
pub fn classify(e: &PublishError) -> Option<Poison> {
    if e.kind() == PublishErrorKind::MaxPayloadExceeded {
        return Some(Poison::new(TOO_LARGE, e.to_string()));
    }
    let source = std::error::Error::source(e)?;
    if source.downcast_ref::<async_nats::SubjectError>().is_some() {
        return Some(Poison::new(BAD_SUBJECT, e.to_string()));
    }
    let code = source
        .downcast_ref::<async_nats::jetstream::Error>()?
        .error_code();
    reason_for_code(code).map(|reason| Poison::new(reason, e.to_string()))
}

/// The reason a JetStream error code parks a message, if it does.
pub fn reason_for_code(code: ErrorCode) -> Option<&'static str> {
    if TOO_LARGE_CODES.contains(&code.0) {
        Some(TOO_LARGE)
    } else if REJECTED_CODES.contains(&code.0) {
        Some(REJECTED)
    } else {
        None
    }
}

/// A subject the relay can publish into the soldonce stream: under
/// `soldonce.`, no empty token, no wildcard token, no whitespace or control
/// character.
pub fn publishable_subject(subject: &str) -> bool {
    let prefix = bus::SUBJECTS.trim_end_matches('>');
    subject.len() > prefix.len()
        && subject.starts_with(prefix)
        && !subject.chars().any(|c| c.is_whitespace() || c.is_control())
        && subject
            .split('.')
            .all(|t| !t.is_empty() && t != "*" && t != ">")
}

/// A message's size as the server counts it against `max_payload`: the
/// header block (`NATS/1.0\r\n`, each `Name: value\r\n`, `\r\n`) plus the
/// payload.
pub fn wire_size(headers: &[(&str, &str)], payload_len: usize) -> usize {
    if headers.is_empty() {
        return payload_len;
    }
    let block: usize = b"NATS/1.0\r\n".len()
        + b"\r\n".len()
        + headers
            .iter()
            .map(|(k, v)| k.len() + 2 + v.len() + 2)
            .sum::<usize>();
    block + payload_len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects() {
        assert!(publishable_subject("soldonce.order.placed.0191"));
        for bad in [
            "",
            "soldonce.",
            "soldonce",
            "other.order.placed",
            "soldonce..x",
            "soldonce.x.",
            "soldonce.a b",
            "soldonce.*",
            "soldonce.>",
            "soldonce.x\r\n",
        ] {
            assert!(!publishable_subject(bad), "{bad:?}");
        }
    }

    #[test]
    fn wire_size_matches_the_header_block() {
        // "NATS/1.0\r\n" (10) + "Nats-Msg-Id: abc\r\n" (18) + "\r\n" (2)
        assert_eq!(wire_size(&[("Nats-Msg-Id", "abc")], 5), 35);
        assert_eq!(wire_size(&[], 5), 5);
    }

    #[test]
    fn codes() {
        assert_eq!(reason_for_code(ErrorCode(10054)), Some(TOO_LARGE));
        assert_eq!(reason_for_code(ErrorCode(10071)), Some(REJECTED));
        // Storage full, stream store failed, no leader, a code not known: retried.
        for transient in [10047, 10077, 10008, 10158, 99999] {
            assert_eq!(reason_for_code(ErrorCode(transient)), None, "{transient}");
        }
    }

    #[test]
    fn a_jetstream_refusal_is_classified_by_its_code() {
        let refused: async_nats::jetstream::Error = serde_json::from_str(
            r#"{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}"#,
        )
        .expect("error JSON");
        let e = PublishError::with_source(PublishErrorKind::Other, refused);
        assert_eq!(classify(&e).map(|p| p.reason), Some(TOO_LARGE));
        let full: async_nats::jetstream::Error = serde_json::from_str(
            r#"{"code":503,"err_code":10077,"description":"maximum bytes exceeded"}"#,
        )
        .expect("error JSON");
        assert!(classify(&PublishError::with_source(PublishErrorKind::Other, full)).is_none());
        assert!(classify(&PublishError::new(PublishErrorKind::TimedOut)).is_none());
        assert!(classify(&PublishError::new(PublishErrorKind::BrokenPipe)).is_none());
        assert!(classify(&PublishError::new(PublishErrorKind::StreamNotFound)).is_none());
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::MaxPayloadExceeded)).map(|p| p.reason),
            Some(TOO_LARGE)
        );
    }
}
