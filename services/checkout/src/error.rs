//! The one error type of the HTTP API, and the one place its RFC 9457
//! problem+json bodies are built. 5xx bodies say nothing internal; the cause
//! rides on the response as a [`Failure`] for the logging middleware, which
//! logs it once.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::{DomainError, Sku};
use platform::Problem;
use store::idempotency::{StoredBody, StoredResponse};
use store::placing::LimitReached;

/// Everything a handler can fail with, business refusals included.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    /// One field of the request is invalid: the problem names it (`field`).
    #[error("invalid request: {why}")]
    InvalidField { field: String, why: String },
    /// A PSP webhook whose status contradicts its event type.
    #[error("webhook type {event_type} cannot carry status {status:?}")]
    WebhookMismatch { event_type: String, status: String },
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
    #[error("no such route")]
    NoRoute,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("not configured: {0}")]
    NotConfigured(&'static str),
    #[error("illegal transition: {0}")]
    Conflict(DomainError),
    #[error("out of stock: {0}")]
    OutOfStock(Sku),
    #[error("product not on sale: {0}")]
    Inactive(Sku),
    #[error("over the per-order limit: at most {max} of {sku}")]
    OverOrderLimit { sku: Sku, max: i64 },
    #[error("limit reached: {0:?}")]
    LimitReached(LimitReached),
    #[error("idempotency key in flight")]
    KeyInFlight,
    #[error("idempotency key reused for a different request")]
    KeyReused,
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A placement waited for a lane past the deadline: nothing was reserved.
    #[error("overloaded: waited {0:?} for a placing lane")]
    Overloaded(std::time::Duration),
    #[error("internal error: {0}")]
    Internal(String),
}

/// The cause of an error response, for the logging middleware only: it is
/// taken off the response before the response leaves the service.
#[derive(Debug, Clone)]
pub(crate) struct Failure(pub String);

impl From<store::StoreError> for ApiError {
    fn from(e: store::StoreError) -> Self {
        ApiError::from(&e)
    }
}

impl From<&store::StoreError> for ApiError {
    fn from(e: &store::StoreError) -> Self {
        if e.is_unavailable() {
            ApiError::Unavailable(e.to_string())
        } else {
            ApiError::Internal(e.to_string())
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
    /// The RFC 9457 body of this error.
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
            ApiError::InvalidField { field, why } => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "Invalid request",
                why.clone(),
            )
            .with("field", field.as_str()),
            ApiError::WebhookMismatch { event_type, status } => Problem::new(
                S::BAD_REQUEST,
                "webhook-type-mismatch",
                "Webhook type and status disagree",
                format!("a {event_type} event cannot carry the status {status:?}; nothing was changed"),
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
            ApiError::NoRoute => Problem::new(S::NOT_FOUND, "not-found", "Not found", "no such route"),
            ApiError::MethodNotAllowed => Problem::new(
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "this route does not accept that method",
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
            ApiError::OutOfStock(sku) => Problem::new(
                S::CONFLICT,
                "out-of-stock",
                "Out of stock",
                format!("not enough {sku} in stock"),
            )
            .with("sku", sku.as_str()),
            ApiError::Inactive(sku) => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "product-inactive",
                "Product not on sale",
                format!("{sku} is not on sale at the moment"),
            )
            .with("sku", sku.as_str()),
            ApiError::OverOrderLimit { sku, max } => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "limit-max-per-order",
                "Over the per-order limit",
                format!("at most {max} of {sku} per order"),
            )
            .with("sku", sku.as_str())
            .with("limit", *max),
            ApiError::LimitReached(LimitReached::ReservedUnits { limit, held }) => Problem::new(
                S::CONFLICT,
                "limit-reserved-units",
                "Too many units held",
                format!("this account already holds {held} of at most {limit} units in unpaid orders; pay or cancel some first"),
            )
            .with("limit", *limit),
            ApiError::LimitReached(LimitReached::PerAccount { sku, limit, held }) => Problem::new(
                S::CONFLICT,
                "limit-per-account",
                "Over the per-account limit",
                format!("at most {limit} of {sku} per account, and this account already has {held}"),
            )
            .with("sku", sku.as_str())
            .with("limit", *limit),
            ApiError::KeyInFlight => Problem::new(
                S::CONFLICT,
                "idempotency-key-in-flight",
                "Request in progress",
                "a request with this Idempotency-Key is still being processed; retry later",
            ),
            ApiError::KeyReused => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused",
                "this Idempotency-Key was used for a different request",
            ),
            ApiError::Unavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the database is busy or unreachable; retry with the same Idempotency-Key",
            ),
            ApiError::Overloaded(waited) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                "Overloaded",
                format!(
                    "the order waited {} ms for its turn and was not placed (nothing is reserved); retry with the same Idempotency-Key",
                    waited.as_millis()
                ),
            ),
            ApiError::Internal(_) => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "an internal error occurred",
            ),
        }
    }

    /// Whether a retry with the same Idempotency-Key must hear this refusal
    /// again: it is then stored under the key (see [`ApiError::to_stored`]).
    pub(crate) fn is_remembered(&self) -> bool {
        matches!(self, ApiError::OutOfStock(_) | ApiError::LimitReached(_))
    }

    /// This error as an answer stored under an Idempotency-Key.
    pub(crate) fn to_stored(&self) -> StoredResponse {
        let problem = self.problem();
        StoredResponse {
            status: problem.status,
            body: StoredBody::Json(problem.to_json()),
            order_id: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = if self.is_remembered() {
            // Rendered from its stored form, so a replay repeats it byte for byte.
            crate::reply::stored_response(&self.to_stored(), false)
        } else {
            self.problem().into_response()
        };
        let h = response.headers_mut();
        match &self {
            ApiError::Unauthorized(_) => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Unavailable(_) | ApiError::Overloaded(_) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::RateLimited(secs) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from((*secs).max(1)));
            }
            _ => {}
        }
        response.extensions_mut().insert(Failure(self.to_string()));
        response
    }
}

/// The API's fallback for a path no route matches.
pub(crate) async fn not_found() -> ApiError {
    ApiError::NoRoute
}

/// The API's fallback for a route that does not take the method.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
