//! The one HTTP error type: every failure renders as RFC 9457
//! `application/problem+json`, with `platform`'s [`Problem`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::faults::FaultsError;
use crate::ledger::LedgerError;
use crate::model::InvalidRequest;

pub use platform::problem::{Problem, PROBLEM_JSON};

/// Everything an API call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No `Idempotency-Key` header on a POST that needs one.
    #[error("the Idempotency-Key header is required")]
    MissingIdempotencyKey,
    /// The `Idempotency-Key` header is empty, too long or not visible ASCII.
    #[error("the Idempotency-Key header must be 1 to 255 visible ASCII characters")]
    InvalidIdempotencyKey,
    /// The body is not JSON.
    #[error("{0}")]
    MalformedBody(String),
    /// The body is JSON of the wrong shape, or breaks a rule.
    #[error("{0}")]
    InvalidBody(String),
    /// The query string is wrong.
    #[error("{0}")]
    InvalidQuery(String),
    /// The fault configuration was refused.
    #[error("{0}")]
    InvalidFaults(#[from] FaultsError),
    /// The books refused the request.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Nothing lives at this path or id.
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not for this method.
    #[error("method not allowed on this path")]
    MethodNotAllowed,
    /// `fail_first` answered instead of the PSP.
    #[error("injected failure (fail_first): nothing was done, try again")]
    InjectedFailure,
}

impl From<InvalidRequest> for ApiError {
    fn from(invalid: InvalidRequest) -> Self {
        ApiError::InvalidBody(invalid.to_string())
    }
}

impl ApiError {
    fn kind(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::MissingIdempotencyKey => (
                StatusCode::BAD_REQUEST,
                "idempotency-key-missing",
                "Idempotency-Key header missing",
            ),
            ApiError::InvalidIdempotencyKey => (
                StatusCode::BAD_REQUEST,
                "idempotency-key-invalid",
                "Idempotency-Key header invalid",
            ),
            ApiError::MalformedBody(_) => (
                StatusCode::BAD_REQUEST,
                "malformed-body",
                "Body is not valid JSON",
            ),
            ApiError::InvalidBody(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-body",
                "Body does not match the schema",
            ),
            ApiError::InvalidQuery(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-query",
                "Query string invalid",
            ),
            ApiError::InvalidFaults(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-faults",
                "Fault configuration refused",
            ),
            ApiError::Ledger(error) => ledger_kind(error),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::InjectedFailure => (
                StatusCode::SERVICE_UNAVAILABLE,
                "injected-failure",
                "Service unavailable",
            ),
        }
    }

    /// The problem body this error renders as.
    pub fn problem(&self) -> Problem {
        let (status, slug, title) = self.kind();
        Problem::typed(
            status,
            format!("urn:psp-sim:problem:{slug}"),
            title,
            self.to_string(),
        )
    }
}

/// Status, slug and title of each refusal of the books.
fn ledger_kind(error: &LedgerError) -> (StatusCode, &'static str, &'static str) {
    match error {
        LedgerError::KeyReused => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency key reused with a different request",
        ),
        LedgerError::PaymentNotFound(_) => (
            StatusCode::NOT_FOUND,
            "payment-not-found",
            "Payment not found",
        ),
        LedgerError::NotRefundable { .. } => (
            StatusCode::CONFLICT,
            "payment-not-refundable",
            "Payment cannot be refunded",
        ),
        LedgerError::NotCaptured { .. } => (
            StatusCode::CONFLICT,
            "payment-not-captured",
            "Payment not captured",
        ),
        LedgerError::NotCapturable { .. } => (
            StatusCode::CONFLICT,
            "payment-not-capturable",
            "Payment cannot be captured",
        ),
        LedgerError::CaptureExceedsAuthorized { .. } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "capture-exceeds-authorized",
            "Capture exceeds the amount authorized",
        ),
        LedgerError::NotCancelable { .. } => (
            StatusCode::CONFLICT,
            "payment-not-cancelable",
            "Payment cannot be canceled",
        ),
        LedgerError::NotAwaitingAction { .. } => (
            StatusCode::CONFLICT,
            "payment-not-awaiting-action",
            "Payment is not awaiting the buyer's action",
        ),
        LedgerError::NotDisputable { .. } => (
            StatusCode::CONFLICT,
            "payment-not-disputable",
            "Payment has nothing to dispute",
        ),
        LedgerError::DisputeExceedsRemaining { .. } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "dispute-exceeds-remaining",
            "Dispute exceeds the amount left",
        ),
        LedgerError::PaymentProcessing(_) => (
            StatusCode::CONFLICT,
            "payment-processing",
            "Payment is still processing",
        ),
        LedgerError::Storage(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage-failed",
            "The books could not be written",
        ),
        LedgerError::ExceedsRemaining { .. } => (
            StatusCode::CONFLICT,
            "refund-exceeds-remaining",
            "Refund exceeds the amount left",
        ),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_key_is_a_422_problem() {
        let response = ApiError::Ledger(LedgerError::KeyReused).into_response();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            response.headers()[axum::http::header::CONTENT_TYPE],
            PROBLEM_JSON
        );
    }

    #[test]
    fn refunding_a_processing_payment_is_a_409_problem_of_its_own() {
        let error = ApiError::Ledger(LedgerError::PaymentProcessing("pay_1".to_owned()));
        let problem = error.problem();
        assert_eq!(problem.status, 409);
        assert_eq!(
            problem.problem_type,
            "urn:psp-sim:problem:payment-processing"
        );
        assert!(problem.detail.contains("pay_1"), "{}", problem.detail);
    }

    #[test]
    fn each_refused_change_names_its_problem_and_the_status_it_met() {
        use crate::model::PaymentStatus;
        let cases = [
            (
                LedgerError::NotCapturable {
                    payment_id: "pay_1".to_owned(),
                    status: PaymentStatus::Succeeded,
                },
                409,
                "payment-not-capturable",
            ),
            (
                LedgerError::NotCancelable {
                    payment_id: "pay_1".to_owned(),
                    status: PaymentStatus::Canceled,
                },
                409,
                "payment-not-cancelable",
            ),
            (
                LedgerError::NotAwaitingAction {
                    payment_id: "pay_1".to_owned(),
                    status: PaymentStatus::Failed,
                },
                409,
                "payment-not-awaiting-action",
            ),
            (
                LedgerError::NotCaptured {
                    payment_id: "pay_1".to_owned(),
                    status: PaymentStatus::RequiresCapture,
                },
                409,
                "payment-not-captured",
            ),
        ];
        for (error, status, slug) in cases {
            let problem = ApiError::Ledger(error).problem();
            assert_eq!(problem.status, status);
            assert_eq!(problem.problem_type, format!("urn:psp-sim:problem:{slug}"));
            assert!(problem.detail.contains("pay_1 is "), "{}", problem.detail);
        }
        let too_much = LedgerError::CaptureExceedsAuthorized {
            requested: 2,
            authorized: 1,
        };
        assert_eq!(ApiError::Ledger(too_much).problem().status, 422);
    }

    #[test]
    fn the_problem_carries_type_title_status_and_detail() {
        let problem = ApiError::MissingIdempotencyKey.problem();
        assert_eq!(
            problem.problem_type,
            "urn:psp-sim:problem:idempotency-key-missing"
        );
        assert_eq!(problem.status, 400);
        assert_eq!(problem.detail, "the Idempotency-Key header is required");
    }
}
