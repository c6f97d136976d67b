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

/// A JSON body: 400 if it is not JSON, 422 if it has the wrong shape (unknown fields included).
pub(super) fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|error| match error.classify() {
        Category::Data => ApiError::InvalidBody(error.to_string()),
        Category::Io | Category::Syntax | Category::Eof => {
            ApiError::MalformedBody(error.to_string())
        }
    })
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
