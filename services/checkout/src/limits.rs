//! Abuse limits kept in each checkout process: a token bucket per account
//! (requests per second) and one for database lookups of tokens the cache
//! does not know while the issued set cannot answer (`issued.rs`), so a
//! flood of unknown tokens cannot drain the pool that real buyers need.
//! Limits on what is *held* (units in open reservations, per-SKU limits)
//! are decided by `domain::limits` on counts read in the placing
//! transaction instead, where they hold across every checkout instance —
//! and again wherever a late payment would revive an order.

use platform::config::{self, ConfigError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `ACCOUNT_RATE_LIMIT`, default 200: requests per second per account (0 = off).
    pub account_rate: u32,
    /// `ACCOUNT_RATE_BURST`, default twice the rate: requests an idle account may send at once.
    pub account_burst: u32,
    /// `TOKEN_LOOKUP_RATE`, default 100: database lookups per second of
    /// tokens the cache does not know, while the issued set cannot answer (0 = off).
    pub token_lookup_rate: u32,
    /// `ACCOUNT_MAX_RESERVED_UNITS`, default 0 (off): units one account may hold in open reservations.
    pub max_reserved_units: i64,
}

impl Limits {
    /// No limit at all (tests and benchmarks that drive one account hard).
    pub fn unlimited() -> Limits {
        Limits {
            account_rate: 0,
            account_burst: 0,
            token_lookup_rate: 0,
            max_reserved_units: 0,
        }
    }

    /// Reads the limits from the environment.
    pub fn from_env() -> Result<Limits, ConfigError> {
        let account_rate = config::var(
            "ACCOUNT_RATE_LIMIT",
            "requests a second per account (0: off); beyond it 429 with Retry-After",
        )
        .parsed(200u32)?;
        let account_burst = config::var(
            "ACCOUNT_RATE_BURST",
            "how many requests an idle account may send at once",
        )
        .default_shown_as("twice ACCOUNT_RATE_LIMIT")
        .parsed(account_rate.saturating_mul(2))?;
        if account_rate > 0 && account_burst == 0 {
            return Err(ConfigError::new(
                "ACCOUNT_RATE_BURST",
                "must be at least 1 while ACCOUNT_RATE_LIMIT is on",
            ));
        }
        let max_reserved_units = config::var(
            "ACCOUNT_MAX_RESERVED_UNITS",
            "units one account may hold in unpaid orders (0: off); beyond it 409 limit-reserved-units",
        )
        .parsed(0i64)?;
        if max_reserved_units < 0 {
            return Err(ConfigError::new(
                "ACCOUNT_MAX_RESERVED_UNITS",
                "must be 0 (off) or more",
            ));
        }
        Ok(Limits {
            account_rate,
            account_burst,
            token_lookup_rate: config::var(
                "TOKEN_LOOKUP_RATE",
                "database lookups a second of tokens the cache does not know while the in-memory set of issued tokens cannot answer (0: off); beyond it 429",
            )
            .parsed(100u32)?,
            max_reserved_units,
        })
    }
}

/// A token bucket: `rate` tokens a second up to `burst`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Takes one token, or says how long until one is there.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        self.tokens =
            (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// Most accounts tracked at once; idle full buckets are dropped beyond it.
const MAX_ACCOUNTS: usize = 100_000;

/// The per-process limiters.
pub(crate) struct Limiter {
    limits: Limits,
    accounts: Mutex<HashMap<Uuid, Bucket>>,
    lookups: Mutex<Bucket>,
}

impl Limiter {
    pub(crate) fn new(limits: Limits) -> Limiter {
        let now = Instant::now();
        let lookups = Bucket {
            tokens: f64::from(limits.token_lookup_rate),
            at: now,
        };
        Limiter {
            limits,
            accounts: Mutex::default(),
            lookups: Mutex::new(lookups),
        }
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Admits one request of `account`, or says when to retry.
    pub(crate) fn admit(&self, account: Uuid) -> Result<(), Duration> {
        if self.limits.account_rate == 0 {
            return Ok(());
        }
        let (rate, burst) = (
            f64::from(self.limits.account_rate),
            f64::from(self.limits.account_burst),
        );
        let now = Instant::now();
        let mut accounts = self
            .accounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if accounts.len() >= MAX_ACCOUNTS {
            // Forget the accounts whose buckets have refilled: they lose nothing.
            accounts.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst
            });
        }
        accounts
            .entry(account)
            .or_insert(Bucket {
                tokens: burst,
                at: now,
            })
            .take(rate, burst, now)
    }

    /// Admits one database lookup of a token the issued set could not vouch for, or says when to retry.
    pub(crate) fn admit_lookup(&self) -> Result<(), Duration> {
        if self.limits.token_lookup_rate == 0 {
            return Ok(());
        }
        let rate = f64::from(self.limits.token_lookup_rate);
        self.lookups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take(rate, rate, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_admits_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut b = Bucket {
            tokens: 3.0,
            at: start,
        };
        for _ in 0..3 {
            assert!(b.take(10.0, 3.0, start).is_ok());
        }
        let wait = b.take(10.0, 3.0, start).expect_err("empty");
        assert!(wait <= Duration::from_millis(100) && wait > Duration::ZERO);
        assert!(
            b.take(10.0, 3.0, start + Duration::from_millis(100))
                .is_ok(),
            "refilled one"
        );
    }

    #[test]
    fn each_account_has_its_own_bucket() {
        let limiter = Limiter::new(Limits {
            account_rate: 1,
            account_burst: 2,
            ..Limits::unlimited()
        });
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert!(limiter.admit(a).is_ok() && limiter.admit(a).is_ok());
        assert!(limiter.admit(a).is_err(), "a is out");
        assert!(limiter.admit(b).is_ok(), "b is not");
        assert!(Limiter::new(Limits::unlimited()).admit(a).is_ok());
    }
}
