//! Reading requests: the `Idempotency-Key` header and JSON bodies, with problem+json errors
//! instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use crate::problem::ApiError;

/// Longest idempotency key accepted.
const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key` header: required, 1 to 255 visible ASCII characters.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers
        .get("idempotency-key")
        .ok_or(ApiError::MissingIdempotencyKey)?;
    let key = value
        .to_str()
        .map_err(|_| ApiError::InvalidIdempotencyKey)?
        .trim();
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::InvalidIdempotencyKey);
    }
    Ok(key.to_owned())
}

/// A JSON body: 400 if it is not JSON, 422 if it has the wrong shape (unknown fields included);
/// a value of the wrong type or variant is named by its field, e.g. `outcome: unknown variant`.
pub(super) fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|error| match error.classify() {
        Category::Data => match field_before(body, error.line(), error.column()) {
            Some(field) if !error.to_string().contains(&format!("`{field}`")) => {
                ApiError::InvalidBody(format!("{field}: {error}"))
            }
            _ => ApiError::InvalidBody(error.to_string()),
        },
        Category::Io | Category::Syntax | Category::Eof => {
            ApiError::MalformedBody(error.to_string())
        }
    })
}

/// The last object key before `line:column` (serde's position of a data error, just after
/// the offending value); serde's own messages name unknown and missing fields but not the
/// field whose value has the wrong type.
fn field_before(body: &[u8], line: usize, column: usize) -> Option<String> {
    let start: usize = body
        .split_inclusive(|b| *b == b'\n')
        .take(line.checked_sub(1)?)
        .map(<[u8]>::len)
        .sum();
    let text = std::str::from_utf8(body.get(..start + column)?).ok()?;
    let mut rest = text;
    let mut last = None;
    // Each `"key":` outside a string value; values that are strings are skipped as keys
    // because no colon follows them.
    while let Some(open) = rest.find('"') {
        let after = &rest[open + 1..];
        let close = after.find('"')?;
        let name = &after[..close];
        let tail = after[close + 1..].trim_start();
        if tail.starts_with(':') {
            last = Some(name.to_owned());
        }
        rest = &after[close + 1..];
    }
    last
}

/// Like [`json_body`], but an empty body means the type's default.
pub(super) fn optional_json_body<T: DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        json_body(body)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{ActionRequest, CaptureRequest};

    fn detail<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> String {
        match json_body::<T>(&Bytes::from(body.to_owned())) {
            Err(ApiError::InvalidBody(detail)) => detail,
            other => panic!("expected InvalidBody, got {other:?}"),
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_or_variant_is_named_by_its_field() {
        let text = detail::<CaptureRequest>(r#"{"amount_minor": "all"}"#);
        assert!(text.starts_with("amount_minor: invalid type"), "{text}");
        let text = detail::<ActionRequest>("{\n  \"outcome\": \"maybe\"\n}");
        assert!(text.starts_with("outcome: unknown variant"), "{text}");
        let text = detail::<ActionRequest>(r#"{"outcome": "failed", "why": "x"}"#);
        assert!(text.contains("`why`"), "{text}");
        let text = detail::<ActionRequest>("{}");
        assert!(text.contains("`outcome`"), "{text}");
    }
}
