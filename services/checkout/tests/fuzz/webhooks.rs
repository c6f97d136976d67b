//! `checkout::webhooks`: Standard Webhooks v1 signatures. Whatever headers
//! and body arrive, checking them never panics and never lets a request in
//! without a signature by one of our keys over exactly its id, timestamp and
//! body, sent within the clock tolerance.

use axum::http::{HeaderMap, HeaderValue};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use checkout::webhooks::authenticate;
use checkout::Secrets;
use hmac::{Hmac, Mac};
use proptest::prelude::*;
use sha2::Sha256;

/// Comfortably inside and outside the 300 s tolerance, so the clock moving
/// between signing and checking cannot decide a case.
const SURELY_CURRENT: i64 = 240;
const SURELY_STALE: i64 = 360;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A signature header entry over `id.ts.body`, as the PSP computes it.
fn sign(key: &[u8], id: &str, ts: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

fn secrets(keys: &[Vec<u8>]) -> Secrets {
    let text: Vec<String> = keys
        .iter()
        .map(|k| format!("whsec_{}", STANDARD.encode(k)))
        .collect();
    Secrets::parse(&text.join(" ")).expect("keys of 32 bytes and more are accepted")
}

/// The three headers; a value a client could not send at all is left out.
fn headers(id: &[u8], ts: &[u8], signature: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in [
        ("webhook-id", id),
        ("webhook-timestamp", ts),
        ("webhook-signature", signature),
    ] {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            map.insert(name, v);
        }
    }
    map
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 32..=64)
}

/// Message ids as PSPs send them: visible ASCII.
fn webhook_id() -> impl Strategy<Value = String> {
    "[!-~]{1,64}"
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..512)
}

/// Timestamps an attacker might send, current ones included.
fn any_timestamp() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            i64::MIN.to_string(),
            (i64::MIN + 1).to_string(),
            i64::MAX.to_string(),
            "-9223372036854775809".to_owned(),
            "9223372036854775808".to_owned(),
            "99999999999999999999999999999999".to_owned(),
            String::new(),
            " ".to_owned(),
            "+".to_owned(),
            "-".to_owned(),
            "-0".to_owned(),
            "1e9".to_owned(),
            "0x10".to_owned(),
            "1.5".to_owned(),
            "NaN".to_owned(),
        ]),
        any::<i64>().prop_map(|n| n.to_string()),
        (-1000i64..1000).prop_map(|d| (now() + d).to_string()),
        "[ +0-9-]{0,25}",
        any::<String>(),
    ]
}

/// Timestamps that are surely outside the tolerance: extremes, and just past it.
fn stale_timestamp() -> impl Strategy<Value = i64> {
    prop_oneof![
        prop::sample::select(vec![i64::MIN, i64::MIN + 1, i64::MAX, 0, -1]),
        any::<i64>().prop_filter("outside the tolerance", |t| now().abs_diff(*t)
            > SURELY_STALE.unsigned_abs()),
        (SURELY_STALE..3_600).prop_map(|d| now() - d),
        (SURELY_STALE..3_600).prop_map(|d| now() + d),
        (SURELY_STALE..1_000_000_000).prop_map(|d| now() - d),
        (SURELY_STALE..1_000_000_000).prop_map(|d| now() + d),
    ]
}

/// The raw MAC of `id.ts.body` under `key`.
fn mac(key: &[u8], id: &str, ts: &str, body: &[u8]) -> Vec<u8> {
    let entry = sign(key, id, ts, body);
    STANDARD
        .decode(entry.trim_start_matches("v1,"))
        .unwrap_or_default()
}

/// A forged request: keys to try (none at all included), then the id,
/// timestamp, signature and body headers sent.
type Forged = (Vec<Vec<u8>>, Vec<u8>, String, Vec<u8>, Vec<u8>);

/// Signature entries that are not a full signature by `key` over exactly
/// `id.ts.body`: junk, another key's, ours over another message, ours cut
/// short or padded out.
fn forged_entry(
    key: Vec<u8>,
    wrong_key: Vec<u8>,
    id: String,
    ts: String,
    body: Vec<u8>,
) -> impl Strategy<Value = String> {
    let wrong = sign(&wrong_key, &id, &ts, &body);
    let ours = mac(&key, &id, &ts, &body);
    let mut longer_body = body.clone();
    longer_body.push(0);
    let elsewhere = vec![
        wrong.replacen("v1,", "v2,", 1),
        wrong.clone(),
        sign(&key, &id, &ts, &longer_body),
        sign(&key, &format!("{id}x"), &ts, &body),
        sign(&key, &id, &format!("{ts}0"), &body),
        sign(&key, "", "", &body),
        sign(&key, &id, &ts, &body).replacen("v1,", "V1,", 1),
        sign(&key, &id, &ts, &body).replacen("v1,", "v1, ", 1),
        "v1,".to_owned(),
        "v1,=".to_owned(),
        "v1,AAAA".to_owned(),
    ];
    prop_oneof![
        any::<String>(),
        prop::collection::vec(any::<u8>(), 32).prop_map(|b| format!("v1,{}", STANDARD.encode(b))),
        "v1,[A-Za-z0-9+/=]{0,50}",
        prop::sample::select(elsewhere),
        (0..ours.len()).prop_map(move |n| format!("v1,{}", STANDARD.encode(&ours[..n]))),
        any::<u8>().prop_map(move |extra| {
            let mut padded = mac(&key, &id, &ts, &body);
            padded.push(extra);
            format!("v1,{}", STANDARD.encode(padded))
        }),
    ]
}

fn forged_request() -> impl Strategy<Value = Forged> {
    let id = prop_oneof![3 => webhook_id().prop_map(String::into_bytes), 1 => prop::collection::vec(any::<u8>(), 0..64)];
    // Mostly current timestamps: a stale one is refused before any signature is looked at.
    let ts = prop_oneof![3 => (-SURELY_CURRENT..=SURELY_CURRENT).prop_map(|d| (now() + d).to_string()), 1 => any_timestamp()];
    (prop::collection::vec(key(), 0..3), key(), id, ts, body()).prop_flat_map(|(keys, wrong_key, id, ts, body)| {
        let ours = keys.first().cloned().unwrap_or_default();
        let entry = forged_entry(ours, wrong_key, String::from_utf8_lossy(&id).into_owned(), ts.clone(), body.clone());
        let signature = prop_oneof![
            4 => prop::collection::vec(entry, 0..4).prop_map(|entries| entries.join(" ").into_bytes()),
            1 => prop::collection::vec(any::<u8>(), 0..128),
        ];
        (Just(keys), Just(id), Just(ts), signature, Just(body))
    })
}

/// Flips one byte (xor with a non-zero mask) at `at`, wrapping round the length.
fn flip(bytes: &mut [u8], at: prop::sample::Index, mask: u8) {
    if !bytes.is_empty() {
        bytes[at.index(bytes.len())] ^= mask;
    }
}

proptest! {
    #[test]
    fn parsing_any_secret_text_never_panics(
        text in prop_oneof![
            any::<String>(),
            "whsec_[A-Za-z0-9+/=]{0,80}",
            prop::collection::vec("(whsec_)?[A-Za-z0-9+/=_-]{0,60}", 0..4).prop_map(|s| s.join(" ")),
        ],
    ) {
        let _ = Secrets::parse(&text);
    }

    #[test]
    fn no_headers_and_body_authenticate_without_a_signature_by_our_key(request in forged_request()) {
        let (keys, id, ts, signature, body) = request;
        let secrets = if keys.is_empty() { Secrets::default() } else { secrets(&keys) };
        let outcome = authenticate(&secrets, &headers(&id, ts.as_bytes(), &signature), &body);
        prop_assert!(outcome.is_err(), "authenticated id {:?}", outcome);
    }

    #[test]
    fn a_body_signed_with_one_of_our_keys_at_a_current_timestamp_verifies(
        keys in prop::collection::vec(key(), 1..4),
        signer in any::<prop::sample::Index>(),
        id in webhook_id(),
        skew in -SURELY_CURRENT..=SURELY_CURRENT,
        body in body(),
        junk in prop::collection::vec("v[0-9],[A-Za-z0-9+/=]{0,44}", 0..3),
    ) {
        let ts = (now() + skew).to_string();
        let mut entries = junk;
        let signing_key: &Vec<u8> = signer.get(&keys);
        entries.insert(entries.len() / 2, sign(signing_key, &id, &ts, &body));
        let signature = entries.join(" ");
        let secrets = secrets(&keys);
        prop_assert!(secrets.verify(&id, &ts, &body, &signature));
        let outcome = authenticate(&secrets, &headers(id.as_bytes(), ts.as_bytes(), signature.as_bytes()), &body);
        prop_assert_eq!(outcome.map_err(|e| e.to_string()), Ok(id));
    }

    #[test]
    fn a_signed_body_at_a_stale_or_absurd_timestamp_is_refused(key in key(), id in webhook_id(), when in stale_timestamp(), body in body()) {
        let ts = when.to_string();
        let signature = sign(&key, &id, &ts, &body);
        let secrets = secrets(&[key]);
        prop_assert!(secrets.verify(&id, &ts, &body, &signature), "the signature itself is good");
        let outcome = authenticate(&secrets, &headers(id.as_bytes(), ts.as_bytes(), signature.as_bytes()), &body);
        prop_assert!(outcome.is_err(), "authenticated at {}", ts);
    }

    #[test]
    fn a_signed_body_with_an_over_long_id_is_refused(key in key(), id in "[!-~]{256,400}", body in body()) {
        let ts = now().to_string();
        let signature = sign(&key, &id, &ts, &body);
        let outcome = authenticate(&secrets(&[key]), &headers(id.as_bytes(), ts.as_bytes(), signature.as_bytes()), &body);
        prop_assert!(outcome.is_err(), "authenticated an id of {} characters", id.len());
    }

    #[test]
    fn flipping_any_byte_of_the_body_id_timestamp_or_signature_fails(
        key in key(),
        id in webhook_id(),
        skew in -SURELY_CURRENT..=SURELY_CURRENT,
        body in prop::collection::vec(any::<u8>(), 1..512),
        target in 0..4usize,
        at in any::<prop::sample::Index>(),
        mask in 1..=u8::MAX,
    ) {
        let ts = (now() + skew).to_string();
        let signature = sign(&key, &id, &ts, &body);
        let (mut id, mut ts, mut signature, mut body) = (id.into_bytes(), ts.into_bytes(), signature.into_bytes(), body);
        let part = match target {
            0 => &mut body,
            1 => &mut id,
            2 => &mut ts,
            _ => &mut signature,
        };
        flip(part, at, mask);
        let secrets = secrets(&[key]);
        let outcome = authenticate(&secrets, &headers(&id, &ts, &signature), &body);
        prop_assert!(outcome.is_err(), "authenticated after flipping a byte of part {}", target);
        if let (Ok(id), Ok(ts), Ok(signature)) = (std::str::from_utf8(&id), std::str::from_utf8(&ts), std::str::from_utf8(&signature)) {
            prop_assert!(!secrets.verify(id, ts, &body, signature));
        }
    }
}
