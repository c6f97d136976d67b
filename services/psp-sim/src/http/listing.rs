//! Paged listings for reconciliation: `GET /v1/payments` (without a lookup parameter) and
//! `GET /v1/refunds`, oldest first by `(created_at, id)`, resumed with an opaque cursor.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::{AppState, SharedState};
use crate::ledger::{Page, PageRequest, Position};
use crate::model::{Refund, PAYMENT_ID_PREFIX, REFUND_ID_PREFIX};
use crate::problem::ApiError;

/// Items per page unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;
/// Most items per page.
const MAX_LIMIT: usize = 1000;

/// The listing parameters, as given.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    /// RFC 3339: only items created at or after this time.
    pub(super) created_gte: Option<String>,
    /// Items per page, 1 to 1000.
    pub(super) limit: Option<String>,
    /// `next_cursor` of an earlier page: only items after that page's last.
    pub(super) cursor: Option<String>,
}

/// Body of a listing: `{"data": […], "has_more": bool, "next_cursor": string|null}`.
#[derive(Debug, Serialize)]
pub(super) struct PageBody<T> {
    data: Vec<T>,
    has_more: bool,
    /// Where to resume: after this page's last item, or where the cursor given pointed if
    /// the page is empty; `null` only if nothing has been listed yet.
    next_cursor: Option<String>,
}

impl ListQuery {
    /// Whether no listing parameter was given.
    pub(super) fn is_empty(&self) -> bool {
        self.created_gte.is_none() && self.limit.is_none() && self.cursor.is_none()
    }

    /// The page asked for, with every parameter checked; cursors must be for ids with `prefix`.
    fn page_request(&self, prefix: &str) -> Result<PageRequest, ApiError> {
        let created_gte = self
            .created_gte
            .as_deref()
            .map(|text| {
                DateTime::parse_from_rfc3339(text)
                    .map(|time| time.with_timezone(&Utc))
                    .map_err(|_| {
                        ApiError::InvalidQuery(format!(
                            "created_gte: must be an RFC 3339 time such as \
                             2026-01-31T12:00:00Z (percent-encode a + offset), got {text:?}"
                        ))
                    })
            })
            .transpose()?;
        let limit = match self.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .parse()
                .ok()
                .filter(|limit| (1..=MAX_LIMIT).contains(limit))
                .ok_or_else(|| {
                    ApiError::InvalidQuery(format!(
                        "limit: must be an integer from 1 to {MAX_LIMIT}, got {text:?}"
                    ))
                })?,
        };
        let after = self
            .cursor
            .as_deref()
            .map(|text| {
                decode_cursor(text, prefix).ok_or_else(|| {
                    ApiError::InvalidQuery(
                        "cursor: not a next_cursor from an earlier page of this listing".to_owned(),
                    )
                })
            })
            .transpose()?;
        Ok(PageRequest {
            created_gte,
            after,
            limit,
        })
    }

    fn body<T>(self, page: Page<T>) -> PageBody<T> {
        PageBody {
            data: page.items,
            has_more: page.has_more,
            next_cursor: page.last.as_ref().map(encode_cursor).or(self.cursor),
        }
    }
}

/// `GET /v1/payments` without `idempotency_key` or `reference`: one page of every payment.
pub(super) fn payments(state: &AppState, list: ListQuery) -> Result<Response, ApiError> {
    let request = list.page_request(PAYMENT_ID_PREFIX)?;
    let page = state.ledger().payments_page(&request);
    Ok(Json(list.body(page)).into_response())
}

/// `GET /v1/refunds`: one page of every refund.
pub(super) async fn refunds(
    State(state): SharedState,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<PageBody<Refund>>, ApiError> {
    let Query(list) = query.map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))?;
    let request = list.page_request(REFUND_ID_PREFIX)?;
    let page = state.ledger().refunds_page(&request);
    Ok(Json(list.body(page)))
}

/// Base64url of `<created_at, RFC 3339 with nanoseconds>/<id>`; opaque to clients.
fn encode_cursor(position: &Position) -> String {
    let created_at = position
        .created_at
        .to_rfc3339_opts(SecondsFormat::Nanos, true);
    URL_SAFE_NO_PAD.encode(format!("{created_at}/{}", position.id))
}

fn decode_cursor(text: &str, prefix: &str) -> Option<Position> {
    let decoded = String::from_utf8(URL_SAFE_NO_PAD.decode(text).ok()?).ok()?;
    let (created_at, id) = decoded.split_once('/')?;
    let created_at = DateTime::parse_from_rfc3339(created_at)
        .ok()?
        .with_timezone(&Utc);
    let tail = id.strip_prefix(prefix)?;
    let plausible = !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_alphanumeric());
    plausible.then(|| Position {
        created_at,
        id: id.to_owned(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_to_the_nanosecond() {
        let position = Position {
            created_at: DateTime::parse_from_rfc3339("2026-01-31T12:00:00.123456789Z")
                .unwrap()
                .with_timezone(&Utc),
            id: "pay_0123abcd".to_owned(),
        };
        let cursor = encode_cursor(&position);
        assert_eq!(decode_cursor(&cursor, PAYMENT_ID_PREFIX), Some(position));
        assert_eq!(decode_cursor(&cursor, REFUND_ID_PREFIX), None);
    }

    #[test]
    fn malformed_cursors_are_refused() {
        for text in [
            "",
            "!!",
            "bm9wZQ",
            &URL_SAFE_NO_PAD.encode("yesterday/pay_1"),
        ] {
            assert_eq!(decode_cursor(text, PAYMENT_ID_PREFIX), None, "{text}");
        }
    }

    #[test]
    fn each_bad_parameter_is_named() {
        let detail = |list: ListQuery| match list.page_request(PAYMENT_ID_PREFIX) {
            Err(ApiError::InvalidQuery(detail)) => detail,
            other => panic!("expected InvalidQuery, got {other:?}"),
        };
        let limit = |text: &str| ListQuery {
            limit: Some(text.to_owned()),
            ..ListQuery::default()
        };
        for text in ["0", "1001", "ten", "-1"] {
            assert!(detail(limit(text)).starts_with("limit: "), "{text}");
        }
        let since = ListQuery {
            created_gte: Some("2026-01-31".to_owned()),
            ..ListQuery::default()
        };
        assert!(detail(since).starts_with("created_gte: "));
        let cursor = ListQuery {
            cursor: Some("abc".to_owned()),
            ..ListQuery::default()
        };
        assert!(detail(cursor).starts_with("cursor: "));
        let fine = ListQuery::default()
            .page_request(PAYMENT_ID_PREFIX)
            .unwrap();
        assert_eq!(fine.limit, DEFAULT_LIMIT);
    }
}
