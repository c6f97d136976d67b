//! Why a command on an order was refused.

use crate::money::MoneyError;
use crate::state::{OrderState, MAX_LINES};
use crate::stock::Sku;
use chrono::{DateTime, Utc};

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    #[error("an order needs 1 to {MAX_LINES} lines, got {0}")]
    LineCount(usize),
    #[error("sku {0} appears on more than one line")]
    DuplicateSku(Sku),
    #[error("{0}")]
    Money(#[from] MoneyError),
    #[error("the order already exists")]
    AlreadyExists,
    #[error("the order does not exist")]
    NotFound,
    #[error("cannot {action} an order that is {from}")]
    IllegalTransition {
        from: OrderState,
        action: &'static str,
    },
    #[error("the reservation does not expire until {0}")]
    NotYetExpired(DateTime<Utc>),
    #[error("no refund was decided for payment {0}")]
    NoRefundDecided(String),
    #[error("no capture was decided for payment {0}")]
    NoCaptureDecided(String),
    #[error("the order's payment has taken no money yet: nothing to refund (an authorization is voided by cancelling the order)")]
    NothingCaptured,
    #[error("a refund of {asked} is more than the {left} left of what the payment took")]
    RefundExceedsCaptured { asked: i64, left: i64 },
    #[error("{0}")]
    InvalidRefund(String),
    #[error("the order has no payment {0} to dispute")]
    NotDisputable(String),
    #[error("the order's goods have left: refund it instead (soldonce order refund)")]
    GoodsLeft,
    #[error("{0}")]
    InvalidCancel(String),
}
