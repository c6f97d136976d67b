//! Parsing and validating `POST /v1/orders` bodies. Malformed JSON is a
//! 400; well-formed JSON with unknown fields or bad values is a 422. Every
//! text field is checked here, before anything reaches the database: a
//! control character (NUL above all, which PostgreSQL refuses) is a 422
//! naming the field, never a failed statement.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use domain::{Quantity, Shipping, Sku};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The body of `POST /v1/orders`, exactly.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PlaceOrderBody {
    lines: Vec<LineBody>,
    #[serde(default)]
    shipping: Option<Shipping>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct LineBody {
    sku: String,
    quantity: i64,
}

/// A validated order request.
#[derive(Debug)]
pub struct OrderRequest {
    pub lines: Vec<(Sku, Quantity)>,
    pub shipping: Option<Shipping>,
    /// SHA-256 of the canonical request: what an idempotency key is bound to.
    pub fingerprint: [u8; 32],
}

/// Rejects bodies that are not JSON by their declared type.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or(""))
    {
        None => Ok(()),
        Some(ct)
            if ct
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")) =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::UnsupportedMediaType),
    }
}

/// The `Idempotency-Key` header: required, 1–255 visible ASCII characters.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers
        .get("idempotency-key")
        .ok_or_else(|| ApiError::Malformed("the Idempotency-Key header is required".into()))?;
    let key = value.to_str().ok().map(str::trim).unwrap_or("");
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::Malformed(
            "the Idempotency-Key must be 1-255 visible ASCII characters".into(),
        ));
    }
    Ok(key.to_owned())
}

/// Parses and validates a body.
pub fn parse(body: &Bytes) -> Result<OrderRequest, ApiError> {
    // Syntax first (400), then shape (422): serde's derived structs would
    // also take an array of the fields in order, so objects are required here.
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::Malformed(format!("the body is not valid JSON: {e}")))?;
    require_objects(&value)?;
    let parsed: PlaceOrderBody =
        serde_json::from_value(value).map_err(|e| ApiError::Invalid(e.to_string()))?;
    if parsed.lines.is_empty() || parsed.lines.len() > domain::order::MAX_LINES {
        return Err(ApiError::Invalid(format!(
            "lines must hold 1 to {} entries, got {}",
            domain::order::MAX_LINES,
            parsed.lines.len()
        )));
    }
    let mut lines = Vec::with_capacity(parsed.lines.len());
    for (i, line) in parsed.lines.iter().enumerate() {
        let sku =
            Sku::parse(&line.sku).map_err(|e| ApiError::Invalid(format!("lines[{i}].sku: {e}")))?;
        let quantity = Quantity::new(line.quantity)
            .map_err(|e| ApiError::Invalid(format!("lines[{i}].quantity: {e}")))?;
        if lines.iter().any(|(s, _)| s == &sku) {
            return Err(ApiError::Invalid(format!(
                "lines[{i}].sku: {sku} appears on more than one line"
            )));
        }
        lines.push((sku, quantity));
    }
    if let Some(s) = &parsed.shipping {
        check_shipping(s)?;
    }
    let canonical = serde_json::to_vec(&parsed).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(OrderRequest {
        lines,
        shipping: parsed.shipping,
        fingerprint: Sha256::digest(&canonical).into(),
    })
}

/// The body, each line and the shipping address must be JSON objects.
fn require_objects(value: &serde_json::Value) -> Result<(), ApiError> {
    let not_object = |what: String| Err(ApiError::Invalid(format!("{what} must be a JSON object")));
    let Some(body) = value.as_object() else {
        return not_object("the body".into());
    };
    if let Some(serde_json::Value::Array(lines)) = body.get("lines") {
        if let Some(i) = lines.iter().position(|l| !l.is_object()) {
            return not_object(format!("lines[{i}]"));
        }
    }
    match body.get("shipping") {
        Some(s) if !s.is_object() && !s.is_null() => not_object("shipping".into()),
        _ => Ok(()),
    }
}

fn check_shipping(s: &Shipping) -> Result<(), ApiError> {
    for (name, value) in [
        ("name", &s.name),
        ("line1", &s.line1),
        ("city", &s.city),
        ("postal_code", &s.postal_code),
    ] {
        let field = format!("shipping.{name}");
        if let Some((at, c)) = refused_char(value) {
            return Err(ApiError::InvalidField {
                why: format!(
                    "{field} must be one line of printable text: U+{:04X} at character {at}",
                    u32::from(c)
                ),
                field,
            });
        }
        if value.trim().is_empty() || value.chars().count() > 200 {
            return Err(ApiError::InvalidField {
                why: format!("{field} must be 1-200 characters"),
                field,
            });
        }
    }
    // Two capital letters: no other character, control or not, gets through.
    if !(s.country.len() == 2 && s.country.bytes().all(|b| b.is_ascii_uppercase())) {
        return Err(ApiError::InvalidField {
            field: "shipping.country".into(),
            why: "shipping.country must be an ISO 3166-1 alpha-2 code such as BR".into(),
        });
    }
    Ok(())
}

/// The first character a one-line text field refuses, with its position:
/// every control character (C0 — NUL, which PostgreSQL cannot store in
/// text or `jsonb`, tab and line breaks among them — DEL and C1), and the
/// Unicode line and paragraph separators. An address is printed on labels
/// and shown to people; none of these belongs in one line of it.
pub fn refused_char(value: &str) -> Option<(usize, char)> {
    value
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
}
