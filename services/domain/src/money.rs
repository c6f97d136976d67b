//! Money as integer minor units plus an ISO 4217 currency code.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why an amount or a currency was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("currency must be three upper-case letters (ISO 4217), got {0:?}")]
    InvalidCurrency(String),
    #[error("amount must not be negative")]
    Negative,
    #[error("amount overflows a 64-bit number of minor units")]
    Overflow,
    #[error("cannot combine {0} with {1}")]
    CurrencyMismatch(Currency, Currency),
}

/// An ISO 4217 alphabetic code such as `BRL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency([u8; 3]);

impl Currency {
    /// The code as text.
    pub fn as_str(&self) -> &str {
        // The constructor admits only ASCII upper-case letters.
        std::str::from_utf8(&self.0).unwrap_or("XXX")
    }
}

impl FromStr for Currency {
    type Err = MoneyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        if b.len() == 3 && b.iter().all(u8::is_ascii_uppercase) {
            Ok(Currency([b[0], b[1], b[2]]))
        } else {
            Err(MoneyError::InvalidCurrency(s.to_owned()))
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A non-negative amount in minor units of one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Money {
    pub minor: i64,
    pub currency: Currency,
}

impl Money {
    /// A checked constructor: negative amounts are refused.
    pub fn new(minor: i64, currency: Currency) -> Result<Self, MoneyError> {
        if minor < 0 {
            return Err(MoneyError::Negative);
        }
        Ok(Money { minor, currency })
    }

    /// Zero in `currency`.
    pub fn zero(currency: Currency) -> Self {
        Money { minor: 0, currency }
    }

    /// Adds two amounts of the same currency, refusing overflow.
    pub fn checked_add(self, other: Money) -> Result<Money, MoneyError> {
        if self.currency != other.currency {
            return Err(MoneyError::CurrencyMismatch(self.currency, other.currency));
        }
        let minor = self
            .minor
            .checked_add(other.minor)
            .ok_or(MoneyError::Overflow)?;
        Ok(Money {
            minor,
            currency: self.currency,
        })
    }

    /// Multiplies by a unit count, refusing overflow.
    pub fn checked_mul(self, units: i64) -> Result<Money, MoneyError> {
        let minor = self.minor.checked_mul(units).ok_or(MoneyError::Overflow)?;
        Money::new(minor, self.currency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brl() -> Currency {
        "BRL".parse().expect("valid")
    }

    #[test]
    fn currencies_are_three_upper_case_letters() {
        assert!("BRL".parse::<Currency>().is_ok());
        for bad in ["brl", "BR", "BRLL", "B1L", ""] {
            assert!(bad.parse::<Currency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn negative_amounts_are_refused() {
        assert_eq!(Money::new(-1, brl()), Err(MoneyError::Negative));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let m = Money::new(i64::MAX, brl()).expect("valid");
        assert_eq!(
            m.checked_add(Money::new(1, brl()).expect("valid")),
            Err(MoneyError::Overflow)
        );
        assert_eq!(m.checked_mul(2), Err(MoneyError::Overflow));
    }

    #[test]
    fn currencies_do_not_mix() {
        let usd: Currency = "USD".parse().expect("valid");
        assert!(matches!(
            Money::zero(brl()).checked_add(Money::zero(usd)),
            Err(MoneyError::CurrencyMismatch(_, _))
        ));
    }
}
