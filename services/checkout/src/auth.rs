//! Bearer-token authentication. Tokens are looked up by their SHA-256
//! digest. A token of the wrong shape is refused without a query; one whose
//! digest was never issued is refused from memory (`issued.rs`), so a flood
//! of made-up tokens never reaches the database and never stands between a
//! buyer and its first `202`. Known and unknown tokens are cached apart.
//! Only while the issued set cannot answer (before its first read, or while
//! it cannot read) are lookups of tokens the cache does not know
//! rate-limited, as before the set: a token that was known and only aged
//! out of the cache is looked up outside that limit. Each account's
//! requests then pass its own rate limit.

use crate::error::ApiError;
use crate::issued::Issued;
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a known token's account stays cached: a revoked token
/// (`soldonce account revoke`) is refused by every checkout within this.
const KNOWN_TTL: Duration = Duration::from_secs(4);
/// How long an aged-out known token is still looked up outside the guess limit.
const KNOWN_REMEMBERED: Duration = Duration::from_secs(3_600);
/// How long an unknown token stays refused without a query.
const UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Most entries in each of the two caches.
const CACHE_MAX: usize = 10_000;

/// A bounded map of digests to what they resolved to, and when.
#[derive(Default)]
struct Entries<T>(RwLock<HashMap<[u8; 32], (T, Instant)>>);

impl<T: Copy> Entries<T> {
    fn get(&self, digest: &[u8; 32], ttl: Duration) -> Option<T> {
        let map = self.0.read().ok()?;
        map.get(digest)
            .filter(|(_, at)| at.elapsed() < ttl)
            .map(|(v, _)| *v)
    }

    fn remove(&self, digest: &[u8; 32]) {
        if let Ok(mut map) = self.0.write() {
            map.remove(digest);
        }
    }

    fn put(&self, digest: [u8; 32], value: T, ttl: Duration) {
        if let Ok(mut map) = self.0.write() {
            if map.len() >= CACHE_MAX {
                map.retain(|_, (_, at)| at.elapsed() < ttl);
                if map.len() >= CACHE_MAX {
                    map.clear();
                }
            }
            map.insert(digest, (value, Instant::now()));
        }
    }
}

/// Recently seen token digests: known ones with their accounts, unknown ones apart.
#[derive(Default)]
pub(crate) struct TokenCache {
    known: Entries<Uuid>,
    unknown: Entries<()>,
}

/// Whether `token` has the shape soldonce issues: `so_` and 64 hex digits.
fn well_formed(token: &str) -> bool {
    token.len() == 67
        && token.starts_with("so_")
        && token[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The authenticated account of a request.
pub(crate) struct Account(pub Uuid);

impl FromRequestParts<AppState> for Account {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or(ApiError::Unauthorized("send Authorization: Bearer <token>"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthorized(
                "the Authorization header must be Bearer <token>",
            ))?;
        let account = resolve(state, token).await?;
        state.limiter.admit(account).map_err(|wait| {
            metrics::counter!("soldonce_rate_limited_total", "limit" => "account").increment(1);
            ApiError::RateLimited(wait.as_secs().saturating_add(1))
        })?;
        Ok(Account(account))
    }
}

async fn resolve(state: &AppState, token: &str) -> Result<Uuid, ApiError> {
    let outcome = |o: &'static str| {
        metrics::counter!("soldonce_token_lookups_total", "outcome" => o).increment(1)
    };
    if !well_formed(token) {
        outcome("malformed");
        return Err(ApiError::Unauthorized("unknown token"));
    }
    let digest = store::accounts::digest(token);
    if let Some(account) = state.tokens.known.get(&digest, KNOWN_TTL) {
        return Ok(account);
    }
    if state.tokens.unknown.get(&digest, UNKNOWN_TTL).is_some() {
        outcome("cached_unknown");
        return Err(ApiError::Unauthorized("unknown token"));
    }
    match state.issued.check(&digest).await {
        Issued::Maybe => {}
        Issued::No => {
            outcome("not_issued");
            return Err(ApiError::Unauthorized("unknown token"));
        }
        Issued::Unsure => {
            metrics::counter!("soldonce_token_set_fallbacks_total").increment(1);
            if state.tokens.known.get(&digest, KNOWN_REMEMBERED).is_none() {
                state.limiter.admit_lookup().map_err(|wait| {
                    outcome("limited");
                    metrics::counter!("soldonce_rate_limited_total", "limit" => "token_lookup")
                        .increment(1);
                    ApiError::RateLimited(wait.as_secs().saturating_add(1))
                })?;
            }
        }
    }
    match store::accounts::authenticate(&state.pool, token).await? {
        Some(account) => {
            outcome("found");
            state.tokens.known.put(digest, account, KNOWN_REMEMBERED);
            Ok(account)
        }
        None => {
            outcome("unknown");
            state.tokens.known.remove(&digest);
            state.tokens.unknown.put(digest, (), UNKNOWN_TTL);
            Err(ApiError::Unauthorized("unknown token"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::well_formed;

    #[test]
    fn only_tokens_of_the_issued_shape_are_looked_up() {
        assert!(well_formed(&format!("so_{}", "ab".repeat(32))));
        for bad in [
            "",
            "so_",
            "so_xyz",
            &format!("so_{}", "zz".repeat(32)),
            &format!("sk_{}", "ab".repeat(32)),
            &format!("so_{}", "ab".repeat(33)),
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }
}
