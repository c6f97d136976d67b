//! RFC 9457 problem details, rendered as `application/problem+json`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// The media type of every problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem response. `kind` becomes the `type` URI `urn:soldonce:problem:<kind>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Extension members, flattened into the body (e.g. `sku`).
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// A problem of `kind` with HTTP `status`.
    pub fn new(status: StatusCode, kind: &str, title: &str, detail: impl Into<String>) -> Self {
        Problem::typed(
            status,
            format!("urn:soldonce:problem:{kind}"),
            title,
            detail,
        )
    }

    /// A problem whose `type` URI is `problem_type`, for a program that
    /// names its problems itself (psp-sim's `urn:psp-sim:problem:<slug>`).
    pub fn typed(
        status: StatusCode,
        problem_type: String,
        title: &str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            problem_type,
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
        }
    }

    /// Adds an extension member.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.insert(key.to_owned(), value.into());
        self
    }

    /// The body as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}
