//! Stock in three buckets — available, reserved, sold — and the only moves
//! between them. The database enforces the same rules with conditional
//! updates and `CHECK (>= 0)`; this module is the reference the audit and the
//! tests hold it to.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest quantity one order line may ask for.
pub const MAX_LINE_QUANTITY: i64 = 1_000_000;

/// Why a stock movement or a stock identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StockError {
    #[error("sku must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-'")]
    InvalidSku,
    #[error("quantity must be between 1 and {MAX_LINE_QUANTITY}, got {0}")]
    InvalidQuantity(i64),
    #[error("not enough stock: {wanted} wanted, {have} in the bucket")]
    Insufficient { wanted: i64, have: i64 },
    #[error("stock arithmetic overflows")]
    Overflow,
}

/// A stock-keeping unit identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sku(String);

impl Sku {
    /// Validates and wraps an identifier.
    pub fn parse(s: &str) -> Result<Self, StockError> {
        let ok = (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Sku(s.to_owned()))
        } else {
            Err(StockError::InvalidSku)
        }
    }

    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Sku {
    type Error = StockError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Sku::parse(&s)
    }
}

impl From<Sku> for String {
    fn from(s: Sku) -> String {
        s.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A positive, bounded number of units on an order line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Quantity(i64);

impl Quantity {
    /// Checks that `n` is within `1..=MAX_LINE_QUANTITY`.
    pub fn new(n: i64) -> Result<Self, StockError> {
        if (1..=MAX_LINE_QUANTITY).contains(&n) {
            Ok(Quantity(n))
        } else {
            Err(StockError::InvalidQuantity(n))
        }
    }

    /// The count.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<i64> for Quantity {
    type Error = StockError;
    fn try_from(n: i64) -> Result<Self, Self::Error> {
        Quantity::new(n)
    }
}

impl From<Quantity> for i64 {
    fn from(q: Quantity) -> i64 {
        q.0
    }
}

/// The three buckets of one SKU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buckets {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// A move between buckets: the only ways stock changes. The store applies
/// exactly these deltas (per unit, or per signed unit for `Adjust`), with a
/// ledger row named [`Movement::ledger_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Movement {
    /// Goods in: → available.
    Receive,
    /// A signed correction of available (shrinkage, recount).
    Adjust,
    /// available → reserved (checkout).
    Reserve,
    /// reserved → sold (payment succeeded).
    Confirm,
    /// reserved → available (payment failed, cancelled, expired).
    Release,
    /// available → sold: a late payment takes an expired order's units back
    /// and sells them at once.
    Reclaim,
    /// sold → available: an operator cancelled a confirmed order before its
    /// goods left.
    Restock,
}

impl Movement {
    /// The change of (available, reserved, sold) for `units` units.
    pub fn delta(self, units: i64) -> Buckets {
        let (a, r, s) = match self {
            Movement::Receive | Movement::Adjust => (1, 0, 0),
            Movement::Reserve => (-1, 1, 0),
            Movement::Confirm => (0, -1, 1),
            Movement::Release => (1, -1, 0),
            Movement::Reclaim => (-1, 0, 1),
            Movement::Restock => (1, 0, -1),
        };
        Buckets {
            available: a * units,
            reserved: r * units,
            sold: s * units,
        }
    }

    /// The `stock_ledger.movement` value (a reclaim is ledgered as the
    /// reservation it is, followed by nothing to confirm).
    pub fn ledger_name(self) -> &'static str {
        match self {
            Movement::Receive => "receive",
            Movement::Adjust => "adjust",
            Movement::Reserve | Movement::Reclaim => "reserve",
            Movement::Confirm => "confirm",
            Movement::Release => "release",
            Movement::Restock => "restock",
        }
    }
}

impl Buckets {
    /// All units ever received plus adjustments: the ledger total.
    pub fn total(&self) -> Option<i64> {
        self.available
            .checked_add(self.reserved)?
            .checked_add(self.sold)
    }

    /// Applies `movement` for `units` units, only if no bucket would go
    /// below zero (the rule the store's conditional update enforces).
    pub fn apply(self, movement: Movement, units: i64) -> Result<Self, StockError> {
        let d = movement.delta(units);
        Ok(Buckets {
            available: shift(self.available, d.available)?,
            reserved: shift(self.reserved, d.reserved)?,
            sold: shift(self.sold, d.sold)?,
        })
    }
}

/// Adds a signed delta to a bucket that must stay non-negative.
fn shift(bucket: i64, delta: i64) -> Result<i64, StockError> {
    let after = bucket.checked_add(delta).ok_or(StockError::Overflow)?;
    if after < 0 {
        return Err(StockError::Insufficient {
            wanted: -delta,
            have: bucket,
        });
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_confirm_release_conserve_units() {
        let b = Buckets::default()
            .apply(Movement::Receive, 10)
            .expect("receive");
        let b = b.apply(Movement::Reserve, 4).expect("reserve");
        assert_eq!(
            b,
            Buckets {
                available: 6,
                reserved: 4,
                sold: 0
            }
        );
        let b = b
            .apply(Movement::Confirm, 3)
            .expect("confirm")
            .apply(Movement::Release, 1)
            .expect("release");
        assert_eq!(
            b,
            Buckets {
                available: 7,
                reserved: 0,
                sold: 3
            }
        );
        assert_eq!(b.total(), Some(10));
    }

    #[test]
    fn reserving_more_than_available_is_refused() {
        let b = Buckets {
            available: 1,
            reserved: 0,
            sold: 0,
        };
        assert_eq!(
            b.apply(Movement::Reserve, 2),
            Err(StockError::Insufficient { wanted: 2, have: 1 })
        );
    }

    #[test]
    fn confirming_or_releasing_unreserved_units_is_refused() {
        let b = Buckets {
            available: 5,
            reserved: 1,
            sold: 0,
        };
        assert!(b.apply(Movement::Confirm, 2).is_err());
        assert!(b.apply(Movement::Release, 2).is_err());
    }

    #[test]
    fn bucket_overflow_is_an_error() {
        let b = Buckets {
            available: i64::MAX,
            reserved: i64::MAX,
            sold: 0,
        };
        assert_eq!(b.apply(Movement::Receive, 1), Err(StockError::Overflow));
        assert_eq!(b.apply(Movement::Release, 1), Err(StockError::Overflow));
        assert_eq!(b.total(), None);
    }

    #[test]
    fn adjust_never_takes_available_below_zero() {
        let b = Buckets {
            available: 3,
            reserved: 0,
            sold: 0,
        };
        assert_eq!(b.apply(Movement::Adjust, -2).expect("adjust").available, 1);
        assert!(b.apply(Movement::Adjust, -4).is_err());
        assert!(b.apply(Movement::Adjust, i64::MAX).is_err());
    }

    #[test]
    fn a_reclaim_sells_available_units_and_every_move_conserves_or_adds() {
        let b = Buckets {
            available: 2,
            reserved: 1,
            sold: 0,
        };
        assert_eq!(
            b.apply(Movement::Reclaim, 2).expect("reclaim"),
            Buckets {
                available: 0,
                reserved: 1,
                sold: 2
            }
        );
        assert!(b.apply(Movement::Reclaim, 3).is_err());
        for m in [
            Movement::Reserve,
            Movement::Confirm,
            Movement::Release,
            Movement::Reclaim,
        ] {
            assert_eq!(m.delta(5).total(), Some(0), "{m:?} conserves units");
        }
        assert_eq!(Movement::Receive.delta(5).total(), Some(5));
    }

    #[test]
    fn quantities_are_positive_and_bounded() {
        for bad in [0, -1, MAX_LINE_QUANTITY + 1, i64::MIN] {
            assert_eq!(Quantity::new(bad), Err(StockError::InvalidQuantity(bad)));
        }
        assert!(Quantity::new(MAX_LINE_QUANTITY).is_ok());
    }

    #[test]
    fn skus_are_short_and_plain() {
        assert!(Sku::parse("TSHIRT-M.blue_1").is_ok());
        for bad in ["", "has space", "ü", &"x".repeat(65)] {
            assert_eq!(Sku::parse(bad), Err(StockError::InvalidSku), "{bad:?}");
        }
    }
}
