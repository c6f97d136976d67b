//! Which tokens were ever issued, held in memory: the first 8 bytes of each
//! digest, read in pages at start (about 16 bytes a token: a million cost
//! 16 MB). A token whose prefix is not there is refused without a lookup, so
//! no made-up token of a flood is looked up, and none takes the lookup
//! budget a buyer would otherwise share with it. A prefix that is there is
//! only a hint: the token is still looked up, so a made-up token sharing 8
//! bytes with an issued one is refused by that lookup.
//!
//! A token issued since the last read is not there yet. Before refusing, a
//! miss waits for a read that began after the request arrived: every token
//! committed before its buyer sent the request is then in the set, on every
//! checkout, with no notification to lose (LISTEN/NOTIFY alone would refuse
//! a buyer whose token's notification was late or lost). Such a read takes the tokens
//! issued since the oldest transaction the previous read could not see
//! (`store::accounts::issued_since`): a few rows, more while a long
//! transaction anywhere holds that horizon back. Misses that arrive
//! together share one read, and reads begin at most every [`READ_GAP`], so a
//! flood of any size costs at most 20 small statements a second.
//!
//! Until the first full read has finished, or when a read fails or takes
//! longer than [`MISS_WAIT`], the set cannot answer and the caller falls back
//! to the budgeted lookup (`TOKEN_LOOKUP_RATE`). Revoked tokens stay in the
//! set until the process restarts; their lookup refuses them.

use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};
use store::accounts::IssuedSince;
use tokio::sync::{mpsc, watch};

/// The least time between the beginnings of two reads of new tokens.
const READ_GAP: Duration = Duration::from_millis(50);
/// How long a miss waits for its read before the caller falls back.
const MISS_WAIT: Duration = Duration::from_secs(2);
/// Digests in one page of the full read.
const PAGE: i64 = 10_000;
/// How long after a failed full read it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// What the set says of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Issued {
    /// Its prefix is held: look it up, outside the budget.
    Maybe,
    /// Never issued, as of a read that began after the request arrived.
    No,
    /// The set cannot say (not read yet, or its read failed or was late).
    Unsure,
}

/// A finished read: when it began, and whether it succeeded.
#[derive(Debug, Clone, Copy)]
struct Read {
    began: Instant,
    ok: bool,
}

type Prefixes = Arc<RwLock<HashSet<u64>>>;

/// The set, and the task that keeps it current (it ends with the set).
pub(crate) struct IssuedTokens {
    prefixes: Prefixes,
    wanted: mpsc::Sender<()>,
    read: watch::Receiver<Option<Read>>,
}

impl IssuedTokens {
    /// Starts the full read, and the task that reads new tokens on demand.
    pub(crate) fn start(pool: PgPool) -> Self {
        for outcome in ["ok", "error"] {
            metrics::counter!("soldonce_token_set_reads_total", "outcome" => outcome).increment(0);
        }
        metrics::counter!("soldonce_token_set_fallbacks_total").increment(0);
        let prefixes = Prefixes::default();
        let (wanted, wants) = mpsc::channel(1);
        let (done, read) = watch::channel(None);
        tokio::spawn(keep_current(pool, prefixes.clone(), wants, done));
        IssuedTokens {
            prefixes,
            wanted,
            read,
        }
    }

    /// Whether the token of `digest` may have been issued.
    pub(crate) async fn check(&self, digest: &[u8; 32]) -> Issued {
        let prefix = prefix(digest);
        if holds(&self.prefixes, prefix) {
            return Issued::Maybe;
        }
        let asked = Instant::now();
        if self.read.borrow().is_none() || self.wanted.is_closed() {
            return Issued::Unsure;
        }
        // Full means a read is wanted already, and it will begin after now.
        let _ = self.wanted.try_send(());
        let mut read = self.read.clone();
        let next = tokio::time::timeout(MISS_WAIT, async {
            read.wait_for(|r| r.is_some_and(|r| r.began >= asked))
                .await
                .map(|r| *r)
        })
        .await;
        match next {
            Ok(Ok(Some(Read { ok: true, .. }))) if holds(&self.prefixes, prefix) => Issued::Maybe,
            Ok(Ok(Some(Read { ok: true, .. }))) => Issued::No,
            _ => Issued::Unsure,
        }
    }
}

fn prefix(digest: &[u8; 32]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

fn holds(prefixes: &Prefixes, prefix: u64) -> bool {
    prefixes
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&prefix)
}

fn add(prefixes: &Prefixes, digests: &[[u8; 32]]) {
    let mut set = prefixes.write().unwrap_or_else(PoisonError::into_inner);
    set.extend(digests.iter().map(prefix));
    metrics::gauge!("soldonce_token_set_size").set(set.len() as f64);
}

/// Reads every digest, then new ones whenever a miss asks.
async fn keep_current(
    pool: PgPool,
    prefixes: Prefixes,
    mut wants: mpsc::Receiver<()>,
    done: watch::Sender<Option<Read>>,
) {
    let mut since = loop {
        let began = Instant::now();
        match read_all(&pool, &prefixes).await {
            Ok(since) => {
                metrics::counter!("soldonce_token_set_reads_total", "outcome" => "ok").increment(1);
                done.send_replace(Some(Read { began, ok: true }));
                break since;
            }
            Err(e) => {
                metrics::counter!("soldonce_token_set_reads_total", "outcome" => "error")
                    .increment(1);
                tracing::warn!(error = %e, "cannot read the issued tokens; unknown tokens take the budgeted lookup meanwhile");
                tokio::select! {
                    () = done.closed() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    };
    let mut last: Option<Instant> = None;
    let mut failing = false;
    while wants.recv().await.is_some() {
        if let Some(last) = last {
            tokio::time::sleep_until((last + READ_GAP).into()).await;
        }
        // Every miss that asked so far arrived before this read begins.
        while wants.try_recv().is_ok() {}
        let began = Instant::now();
        last = Some(began);
        let ok = match store::accounts::issued_since(&pool, since).await {
            Ok((digests, next)) => {
                add(&prefixes, &digests);
                since = next;
                if failing {
                    tracing::info!("reading new tokens again");
                }
                true
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read new tokens; unknown tokens take the budgeted lookup meanwhile");
                }
                false
            }
        };
        failing = !ok;
        let outcome = if ok { "ok" } else { "error" };
        metrics::counter!("soldonce_token_set_reads_total", "outcome" => outcome).increment(1);
        done.send_replace(Some(Read { began, ok }));
    }
}

/// Every digest, a page at a time; where reads of new tokens take up.
async fn read_all(pool: &PgPool, prefixes: &Prefixes) -> Result<IssuedSince, store::StoreError> {
    // Before the pages: a token whose transaction commits meanwhile is read after.
    let since = store::accounts::issued_horizon(pool).await?;
    let mut after = None;
    loop {
        let page = store::accounts::token_digests(pool, after.as_ref(), PAGE).await?;
        add(prefixes, &page);
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = Some(*last),
            _ => return Ok(since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix;

    #[test]
    fn a_prefix_is_the_digests_first_eight_bytes() {
        let mut digest = [0xffu8; 32];
        digest[..8].copy_from_slice(&[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(prefix(&digest), 0x0102);
    }
}
