//! Bearer-token authentication. Tokens are looked up by their SHA-256
//! digest; a short-lived cache keeps the lookup off the hot path.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::header;
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a token's account stays cached.
const CACHE_TTL: Duration = Duration::from_secs(30);
const CACHE_MAX: usize = 10_000;

/// Recently seen token digests and their accounts.
#[derive(Default)]
pub(crate) struct TokenCache(RwLock<HashMap<[u8; 32], (Uuid, Instant)>>);

impl TokenCache {
    fn get(&self, digest: &[u8; 32]) -> Option<Uuid> {
        let map = self.0.read().ok()?;
        map.get(digest).filter(|(_, at)| at.elapsed() < CACHE_TTL).map(|(id, _)| *id)
    }

    fn put(&self, digest: [u8; 32], account: Uuid) {
        if let Ok(mut map) = self.0.write() {
            if map.len() >= CACHE_MAX {
                map.clear();
            }
            map.insert(digest, (account, Instant::now()));
        }
    }
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
            .ok_or(ApiError::Unauthorized("the Authorization header must be Bearer <token>"))?;
        let digest = store::accounts::digest(token);
        if let Some(account) = state.tokens.get(&digest) {
            return Ok(Account(account));
        }
        let account = store::accounts::authenticate(&state.pool, token)
            .await?
            .ok_or(ApiError::Unauthorized("unknown token"))?;
        state.tokens.put(digest, account);
        Ok(Account(account))
    }
}
