//! Standard Webhooks v1 signatures: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! keyed with the base64-decoded part of a `whsec_…` secret.
//!
//! Public so a receiver's tests can sign and check webhooks with the same algorithm.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix every webhook secret carries.
pub const SECRET_PREFIX: &str = "whsec_";

/// A webhook signing secret, parsed from its `whsec_<base64>` form; its Debug output hides the key.
#[derive(Clone)]
pub struct WebhookSecret {
    mac: HmacSha256,
}

/// Why a string is not a webhook secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// The text does not start with `whsec_`.
    #[error("must start with `whsec_`")]
    MissingPrefix,
    /// The part after the prefix is not standard base64.
    #[error("the part after `whsec_` is not valid base64")]
    NotBase64,
    /// The decoded key is empty.
    #[error("the key after `whsec_` is empty")]
    Empty,
    /// The decoded key is too short to resist guessing.
    #[error("the key after `whsec_` must be at least 24 bytes (32 base64 characters), got {0}")]
    TooShort(usize),
}

/// Shortest signing key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 24;

impl WebhookSecret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64)?;
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        if key.len() < MIN_KEY_BYTES {
            return Err(SecretError::TooShort(key.len()));
        }
        // HMAC takes keys of any length, so this cannot fail for a non-empty key.
        let mac = HmacSha256::new_from_slice(&key).map_err(|_| SecretError::Empty)?;
        Ok(Self { mac })
    }

    fn mac_of(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl FromStr for WebhookSecret {
    type Err = SecretError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// The `webhook-signature` header value for one delivery attempt: `v1,<base64>`.
pub fn sign(secret: &WebhookSecret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret
        .mac_of(msg_id, timestamp, body)
        .finalize()
        .into_bytes();
    format!("v1,{}", STANDARD.encode(tag))
}

/// Whether any `v1,` entry of a (space-separated) `webhook-signature` header matches, compared in
/// constant time. Checking the timestamp's age is the receiver's policy, not done here.
pub fn verify(
    secret: &WebhookSecret,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
) -> bool {
    let expected = secret.mac_of(msg_id, timestamp, body);
    signature_header
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .any(|tag| expected.clone().verify_slice(&tag).is_ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // The example from the Standard Webhooks specification.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn secret() -> WebhookSecret {
        WebhookSecret::parse(SECRET).unwrap()
    }

    #[test]
    fn signing_the_spec_example_gives_the_spec_signature() {
        assert_eq!(sign(&secret(), MSG_ID, TIMESTAMP, BODY), SIGNATURE);
    }

    #[test]
    fn the_spec_signature_verifies_among_other_entries() {
        let header = format!("v1,bm90IGl0 {SIGNATURE}");
        assert!(verify(&secret(), MSG_ID, TIMESTAMP, BODY, &header));
    }

    #[test]
    fn a_changed_body_or_timestamp_does_not_verify() {
        assert!(!verify(&secret(), MSG_ID, TIMESTAMP, b"{}", SIGNATURE));
        assert!(!verify(&secret(), MSG_ID, TIMESTAMP + 1, BODY, SIGNATURE));
    }

    #[test]
    fn secrets_need_the_prefix_and_base64() {
        assert_eq!(
            WebhookSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").err(),
            Some(SecretError::MissingPrefix)
        );
        assert_eq!(
            WebhookSecret::parse("whsec_not base64!").err(),
            Some(SecretError::NotBase64)
        );
        assert_eq!(
            WebhookSecret::parse("whsec_").err(),
            Some(SecretError::Empty)
        );
    }

    #[test]
    fn debug_output_hides_the_key() {
        assert_eq!(format!("{:?}", secret()), "WebhookSecret(..)");
    }
}
