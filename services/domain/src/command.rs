//! Order commands: what can be asked of an order.

use crate::dispute::DisputeFact;
use crate::money::Money;
use crate::payment::PaidFact;
use crate::state::Shipping;
use crate::stock::{Quantity, Sku};
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The command that opens an order; prices come from the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceOrder {
    pub order_id: Uuid,
    pub account_id: Uuid,
    pub lines: Vec<(Sku, Quantity, Money)>,
    pub shipping: Option<Shipping>,
    pub placed_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What can be asked of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Place(PlaceOrder),
    /// The PSP reports a succeeded payment for the order: confirm on it, or
    /// decide to refund it. For an expired order the store supplies whether
    /// its units were found sold (`units_gone`) and the account's per-SKU
    /// limits with what it holds (`holdings`): a revival never breaks them.
    Paid {
        fact: PaidFact,
        units_gone: bool,
        holdings: Vec<crate::limits::Holding>,
    },
    /// The PSP declined: final. `abandoned`: the buyer left the payment's
    /// 3-D Secure challenge unfinished — the order it waited on expires, as
    /// any unpaid order does.
    FailPayment {
        payment_id: Option<String>,
        reason: String,
        abandoned: bool,
        at: DateTime<Utc>,
    },
    Cancel {
        at: DateTime<Utc>,
    },
    Expire {
        at: DateTime<Utc>,
    },
    /// The PSP confirmed the refund decided for this payment.
    RecordRefund {
        payment_id: String,
        at: DateTime<Utc>,
    },
    /// The order's goods left: capture its authorized payment, once.
    DecideCapture {
        at: DateTime<Utc>,
    },
    /// The PSP confirmed the capture decided for this payment.
    RecordCapture {
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// An operator refunds part or all of what the order's payment took, once per key.
    RefundByOperator {
        key: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// An operator cancels the order: a pending one like a buyer would; a
    /// confirmed one whose goods have not left (`shipped`: the store says
    /// whether they have) gives its units back and its payment's money
    /// (void or refund, see `operator.rs`).
    CancelByOperator {
        shipped: bool,
        reason: String,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed the operator's refund under this key.
    RecordOperatorRefund {
        key: String,
        at: DateTime<Utc>,
    },
    /// The PSP asks the buyer to act (3-D Secure) on this payment: wait for
    /// it, extending the reservation once by `extension`.
    AwaitAction {
        payment_id: String,
        url: String,
        extension: chrono::Duration,
        at: DateTime<Utc>,
    },
    /// The PSP reports a dispute of one of the order's payments: record it, once.
    Dispute(DisputeFact),
    /// The PSP reports a refund of the order's payment that soldonce did
    /// not make (its dashboard, another system): record it (the store
    /// records each refund id once).
    RecordRefundElsewhere {
        refund_id: String,
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
}
