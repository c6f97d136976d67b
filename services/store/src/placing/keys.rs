//! The idempotency keys of a placing group: claimed (try-locked, then
//! read) before anything is decided, and written with their final answers
//! in the group's statement.

use super::Placement;
use crate::idempotency::{self, Claim, KeyedRequest, StoredBody, StoredResponse};
use crate::statement::Statement;
use crate::StoreError;
use sqlx::PgConnection;
use uuid::Uuid;

/// The stored responses of idempotency keys (`$1` accounts, `$2` keys,
/// pairwise), each with its 1-based position. Its statement runs inside a
/// function that plans it at every call on the table as it is then
/// (migration `planned_at_each_call`), in one round trip, as the inbox's
/// look-up does (see `inbox::SEEN_SQL`): a generic plan made while the
/// table was small hashes every stored key (a sequential scan), where a
/// plan that sees the arrays probes the key's index once per key.
///
/// A key whose body is not stored (a `202`: [`StoredBody::Placed`]) comes
/// with its order's first event, which the body is rebuilt from.
pub const KEYS_SQL: &str = "SELECT * FROM idempotency_keys_stored($1, $2)";

/// Try-locks each key (`$1`, by position), and says whether the commit
/// will wait for synchronous standbys.
const LOCK_SQL: &str = concat!(
    "SELECT i, pg_try_advisory_xact_lock(l), ",
    crate::replication::waits!(),
    " FROM unnest($1::bigint[]) WITH ORDINALITY AS t(l, i)"
);

/// A key already stored: the request it was first used for, and its answer.
#[derive(Debug, Clone)]
pub(super) struct StoredKey {
    pub fingerprint: Vec<u8>,
    pub response: StoredResponse,
}

impl StoredKey {
    /// What a request with `fingerprint` under this key hears.
    pub(super) fn answer(&self, fingerprint: &[u8]) -> Claim {
        if self.fingerprint == fingerprint {
            Claim::Replay(self.response.clone())
        } else {
            Claim::Mismatch
        }
    }
}

/// Each claim of [`claim`], with the stored key it was answered from.
pub(super) type Claims = Vec<(Claim, Option<StoredKey>)>;

/// Try-locks the keys of `which` (a lock held elsewhere: `InFlight`; never
/// waits), then, in a statement of its own so it sees every commit made
/// before the locks were taken, reads the keys already stored: each claim,
/// with the stored key it was answered from; and whether the transaction's
/// commit will wait for synchronous standbys, read by the locking
/// statement (`replication::waits!`; `None` when it read no row).
pub(super) async fn claim(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    which: &[usize],
) -> Result<(Claims, Option<bool>), StoreError> {
    let locks: Vec<i64> = which
        .iter()
        .map(|&i| idempotency::lock_id(&group[i].key))
        .collect();
    let got: Vec<(i64, bool, bool)> = sqlx::query_as(LOCK_SQL)
        .bind(&locks)
        .fetch_all(&mut *conn)
        .await?;
    let waits = got.first().map(|(_, _, waits)| *waits);
    let mut claims = vec![(Claim::InFlight, None); which.len()];
    let mut locked = Vec::new();
    for (i, got, _) in got {
        let at = usize::try_from(i - 1).map_err(|_| StoreError::Corrupt("ordinality".into()))?;
        if got && at < which.len() {
            claims[at].0 = Claim::Claimed;
            locked.push(at);
        }
    }
    if locked.is_empty() {
        return Ok((claims, waits));
    }
    let accounts: Vec<Uuid> = locked
        .iter()
        .map(|&a| group[which[a]].key.account_id)
        .collect();
    let keys: Vec<&str> = locked.iter().map(|&a| group[which[a]].key.key).collect();
    type Stored = (
        i64,
        Vec<u8>,
        i16,
        Option<serde_json::Value>,
        Option<Uuid>,
        Option<String>,
        Option<serde_json::Value>,
    );
    let stored: Vec<Stored> = sqlx::query_as(KEYS_SQL)
        .bind(&accounts)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?;
    for (i, fingerprint, status, body, order_id, placed_type, placed_data) in stored {
        let body = match (body, placed_type, placed_data) {
            (Some(body), _, _) => StoredBody::Json(body),
            (None, Some(type_name), Some(data)) => {
                StoredBody::Placed(Box::new(placed(&type_name, data)?))
            }
            (None, _, _) => {
                let order = order_id.map_or_else(|| "none".to_owned(), |id| id.to_string());
                return Err(StoreError::Corrupt(format!(
                    "an idempotency key stores no response and its order ({order}) has no first event to rebuild it from"
                )));
            }
        };
        let at = usize::try_from(i - 1)
            .ok()
            .and_then(|n| locked.get(n).copied())
            .ok_or_else(|| StoreError::Corrupt("ordinality".into()))?;
        let stored = StoredKey {
            fingerprint,
            response: StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt("idempotency status".into()))?,
                body,
                order_id,
            },
        };
        claims[at] = (
            stored.answer(&group[which[at]].key.fingerprint),
            Some(stored),
        );
    }
    Ok((claims, waits))
}

/// The order its first event placed: what a `202` stored as
/// [`StoredBody::Placed`] shows.
fn placed(type_name: &str, data: serde_json::Value) -> Result<domain::Order, StoreError> {
    let event = domain::Event::from_parts(type_name, data)
        .map_err(|e| StoreError::Corrupt(format!("an order's first event cannot be read: {e}")))?;
    domain::fold(std::iter::once(&event)).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "an order's first event ({type_name}) places no order"
        ))
    })
}

/// Keys with their final answers, inserted in one statement.
#[derive(Default)]
pub(super) struct StoredKeys<'a> {
    accounts: Vec<Uuid>,
    keys: Vec<&'a str>,
    fingerprints: Vec<Vec<u8>>,
    statuses: Vec<i16>,
    /// NULL for a [`StoredBody::Placed`]: its order's first event holds it.
    bodies: Vec<Option<serde_json::Value>>,
    orders: Vec<Option<Uuid>>,
}

impl<'a> StoredKeys<'a> {
    pub(super) fn push(&mut self, key: &KeyedRequest<'a>, answer: &StoredResponse) {
        self.accounts.push(key.account_id);
        self.keys.push(key.key);
        self.fingerprints.push(key.fingerprint.to_vec());
        self.statuses
            .push(i16::try_from(answer.status).unwrap_or(500));
        self.bodies.push(match &answer.body {
            StoredBody::Json(body) => Some(body.clone()),
            StoredBody::Placed(_) => None,
        });
        self.orders.push(answer.order_id);
    }

    /// Inserts the keys, as the first fragment of `statement`.
    pub(super) fn insert_into<'q>(
        &'q self,
        statement: &mut Statement<'q>,
    ) -> Result<(), StoreError> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let s = statement;
        let (accounts, keys) = (s.bind(&self.accounts)?, s.bind(&self.keys)?);
        let (fingerprints, statuses) = (s.bind(&self.fingerprints)?, s.bind(&self.statuses)?);
        let (bodies, orders) = (s.bind(&self.bodies)?, s.bind(&self.orders)?);
        s.cte(
            "keyed",
            &format!(
                "INSERT INTO idempotency_keys (account_id, key, fingerprint, status, response_body, order_id) \
                 SELECT * FROM unnest({accounts}::uuid[], {keys}::text[], {fingerprints}::bytea[], {statuses}::smallint[], {bodies}::jsonb[], {orders}::uuid[]) \
                 RETURNING 1"
            ),
        );
        s.in_order("keyed");
        Ok(())
    }
}
