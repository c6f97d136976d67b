//! The one error type of the HTTP API, rendered as RFC 9457 problem+json.
//! 5xx bodies say nothing internal; the cause is logged once here.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::DomainError;
use platform::Problem;

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("payload too large")]
    TooLarge,
    #[error("request head too large")]
    HeadTooLarge,
    #[error("rate limited for {0} s")]
    RateLimited(u64),
    #[error("order not found")]
    NotFound,
    #[error("not configured: {0}")]
    NotConfigured(&'static str),
    #[error("illegal transition: {0}")]
    Conflict(DomainError),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<store::StoreError> for ApiError {
    fn from(e: store::StoreError) -> Self {
        match e {
            store::StoreError::Database(
                sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed,
            ) => ApiError::Unavailable(e.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(r: axum::extract::rejection::BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge
        } else {
            ApiError::Malformed(r.body_text())
        }
    }
}

impl ApiError {
    pub(crate) fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            ApiError::Unauthorized(why) => {
                Problem::new(S::UNAUTHORIZED, "unauthorized", "Unauthorized", *why)
            }
            ApiError::Malformed(why) => Problem::new(
                S::BAD_REQUEST,
                "malformed-request",
                "Malformed request",
                why.clone(),
            ),
            ApiError::Invalid(why) => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "Invalid request",
                why.clone(),
            ),
            ApiError::UnsupportedMediaType => Problem::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                "send the body as application/json",
            ),
            ApiError::TooLarge => Problem::new(
                S::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
                format!("the body must be at most {} bytes", crate::MAX_BODY_BYTES),
            ),
            ApiError::HeadTooLarge => Problem::new(
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "head-too-large",
                "Request header fields too large",
                format!(
                    "the request line and headers must be at most {} bytes",
                    crate::MAX_HEAD_BYTES
                ),
            ),
            ApiError::RateLimited(secs) => Problem::new(
                S::TOO_MANY_REQUESTS,
                "rate-limited",
                "Too many requests",
                format!("this account sends requests faster than allowed; retry in {secs} s"),
            ),
            ApiError::NotFound => Problem::new(
                S::NOT_FOUND,
                "not-found",
                "Not found",
                "no such order for this account",
            ),
            ApiError::NotConfigured(why) => {
                Problem::new(S::NOT_FOUND, "not-found", "Not found", *why)
            }
            ApiError::Conflict(e) => {
                let p = Problem::new(S::CONFLICT, "illegal-transition", "Conflict", e.to_string());
                match e {
                    DomainError::IllegalTransition { from, .. } => p.with("state", from.as_str()),
                    _ => p,
                }
            }
            ApiError::Unavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the database is busy or unreachable; retry with the same Idempotency-Key",
            ),
            ApiError::Internal(_) => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "an internal error occurred",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(cause) | ApiError::Unavailable(cause) => {
                tracing::error!(%cause, "request failed")
            }
            _ => tracing::debug!(error = %self, "request refused"),
        }
        let mut response = self.problem().into_response();
        if matches!(self, ApiError::Unauthorized(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(self, ApiError::Unavailable(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let ApiError::RateLimited(secs) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

pub(crate) async fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "not-found",
        "Not found",
        "no such route",
    )
}

pub(crate) async fn method_not_allowed() -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        "this route does not accept that method",
    )
}
