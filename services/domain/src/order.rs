//! The order aggregate: `decide` turns a command into events against the
//! current state, `evolve` folds one event into the state. An order's state
//! is exactly the fold of its events; the `orders` table is a cache of it.

use crate::dispute::{self, DisputeFact, DisputeRef};
use crate::money::{Currency, Money, MoneyError};
use crate::payment::{self, PaidFact, RefundReason, RefundRef};
use crate::stock::{Movement, Quantity, Sku};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most lines one order may have.
pub const MAX_LINES: usize = 100;

/// Where an order is in the saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    PaymentPending,
    Confirmed,
    PaymentFailed,
    Cancelled,
    Expired,
    Refunded,
}

impl OrderState {
    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderState::PaymentPending => "payment_pending",
            OrderState::Confirmed => "confirmed",
            OrderState::PaymentFailed => "payment_failed",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
            OrderState::Refunded => "refunded",
        }
    }

    /// Whether the order's units sit in the `reserved` bucket.
    pub fn holds_reservation(self) -> bool {
        self == OrderState::PaymentPending
    }
}

impl std::fmt::Display for OrderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of an order, priced from the catalogue when it was placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub sku: Sku,
    pub quantity: Quantity,
    pub unit_price_minor: i64,
}

/// A delivery address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shipping {
    pub name: String,
    pub line1: String,
    pub city: String,
    pub postal_code: String,
    pub country: String,
}

/// The payment that settled an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRef {
    pub payment_id: String,
    pub amount_minor: i64,
    /// Where the money is: taken at once, or authorized and captured later.
    #[serde(default)]
    pub capture: Capture,
}

/// Whether an order's payment has taken the money yet. A payment made
/// with automatic capture took it when it succeeded; an authorization
/// (`CAPTURE_AT=shipment`) holds it until a capture is decided (when the
/// order ships) and the PSP confirms it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capture {
    /// Captured by the PSP when the payment succeeded.
    #[default]
    Automatic,
    /// Authorized; nothing taken yet.
    Authorized,
    /// The capture is decided and owed: the payment worker carries it out.
    Decided,
    /// The PSP confirmed the capture.
    Captured,
    /// The authorization is to be voided, or was: its order was cancelled
    /// by an operator before its goods left. Nothing is ever taken.
    Voided,
}

impl Capture {
    /// The projection's column value: `None` for [`Capture::Automatic`].
    pub fn column(self) -> Option<&'static str> {
        match self {
            Capture::Automatic => None,
            Capture::Authorized => Some("authorized"),
            Capture::Decided => Some("decided"),
            Capture::Captured => Some("captured"),
            Capture::Voided => Some("voided"),
        }
    }

    /// Reads the projection's column value.
    pub fn from_column(value: Option<&str>) -> Option<Capture> {
        match value {
            None => Some(Capture::Automatic),
            Some("authorized") => Some(Capture::Authorized),
            Some("decided") => Some(Capture::Decided),
            Some("captured") => Some(Capture::Captured),
            Some("voided") => Some(Capture::Voided),
            Some(_) => None,
        }
    }
}

/// `skip_serializing_if` for flags that old events never carried.
fn is_false(flag: &bool) -> bool {
    !*flag
}

/// The state every event of one order folds into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: Uuid,
    pub account_id: Uuid,
    pub state: OrderState,
    pub lines: Vec<OrderLine>,
    pub currency: Currency,
    pub total_minor: i64,
    pub shipping: Option<Shipping>,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub payment: Option<PaymentRef>,
    /// Refunds decided against payments that could not settle this order.
    pub refunds: Vec<RefundRef>,
    /// Refunds an operator asked for, of the payment the order stands on.
    #[serde(default)]
    pub operator_refunds: Vec<crate::operator::OperatorRefund>,
    /// The buyer's action a payment waits for (3-D Secure), once asked.
    #[serde(default)]
    pub next_action: Option<crate::action::NextAction>,
    /// Disputes (chargebacks) the PSP reported against its payments.
    #[serde(default)]
    pub disputes: Vec<DisputeRef>,
    /// How many events the order has: the version the next one must follow.
    pub version: i32,
}

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

/// Something that happened to an order. The serde tag is the event's stable
/// type name and version; it never changes once shipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum Event {
    #[serde(rename = "order.placed.v1")]
    Placed {
        order_id: Uuid,
        account_id: Uuid,
        lines: Vec<OrderLine>,
        currency: Currency,
        total_minor: i64,
        shipping: Option<Shipping>,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.confirmed.v1")]
    Confirmed {
        payment_id: String,
        amount_minor: i64,
        reactivated: bool,
        /// The payment is an authorization: the money is taken by a
        /// capture when the order ships. Absent (false) on payments
        /// captured at once, and on every event written before.
        #[serde(default, skip_serializing_if = "is_false")]
        uncaptured: bool,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.payment_failed.v1")]
    PaymentFailed {
        payment_id: Option<String>,
        reason: String,
        at: DateTime<Utc>,
    },
    #[serde(rename = "order.cancelled.v1")]
    Cancelled { at: DateTime<Utc> },
    #[serde(rename = "order.expired.v1")]
    Expired { at: DateTime<Utc> },
    /// A payment that cannot settle the order is to be refunded; decided
    /// before the PSP is called, so nothing can confirm on it afterwards.
    #[serde(rename = "order.refund_decided.v1")]
    RefundDecided {
        payment_id: String,
        amount_minor: i64,
        currency: String,
        reason: RefundReason,
        /// The payment is an uncaptured authorization: it is voided (no
        /// money moved), not refunded.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed a decided refund (or void).
    #[serde(rename = "order.refunded.v1")]
    Refunded {
        payment_id: String,
        amount_minor: i64,
        /// The authorization was voided: nothing had been taken.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The order shipped: its authorized payment is to be captured. Decided
    /// before the PSP is called, once per order, so nothing can void it after.
    #[serde(rename = "order.capture_decided.v1")]
    CaptureDecided {
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed the decided capture: the money is taken.
    #[serde(rename = "order.captured.v1")]
    Captured {
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
    /// An operator asked to refund part or all of what the order's payment
    /// took, under their key; carried out by the payment worker.
    #[serde(rename = "order.operator_refund_decided.v1")]
    OperatorRefundDecided {
        key: String,
        payment_id: String,
        amount_minor: i64,
        /// The payment is an uncaptured authorization: it is voided (an
        /// operator's cancel), not refunded.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// An operator cancelled the order after it was confirmed, before its
    /// goods left: its units go back on sale; the money is given back by
    /// the `order.operator_refund_decided` that follows.
    #[serde(rename = "order.operator_cancelled.v1")]
    OperatorCancelled { reason: String, at: DateTime<Utc> },
    /// A payment waits for the buyer's action (3-D Secure) at `url`; the
    /// reservation now lasts until `expires_at`.
    #[serde(rename = "order.action_required.v1")]
    ActionRequired {
        payment_id: String,
        url: String,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// The PSP confirmed an operator's refund.
    #[serde(rename = "order.operator_refunded.v1")]
    OperatorRefunded {
        key: String,
        payment_id: String,
        amount_minor: i64,
        /// The authorization was voided: nothing had been taken.
        #[serde(default, skip_serializing_if = "is_false")]
        void: bool,
        at: DateTime<Utc>,
    },
    /// The buyer's bank took money back from one of the order's payments (see `dispute.rs`).
    #[serde(rename = "order.disputed.v1")]
    Disputed {
        dispute_id: String,
        payment_id: String,
        amount_minor: i64,
        reason: String,
        at: DateTime<Utc>,
    },
    /// Money of the order's payment was refunded outside soldonce (at the
    /// PSP's dashboard, by another system): named to a person, its
    /// shipment held; the order keeps its state.
    #[serde(rename = "order.refunded_elsewhere.v1")]
    RefundedElsewhere {
        refund_id: String,
        payment_id: String,
        amount_minor: i64,
        at: DateTime<Utc>,
    },
}

impl Event {
    /// The stable type name with its version, e.g. `order.placed.v1`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Placed { .. } => "order.placed.v1",
            Event::Confirmed { .. } => "order.confirmed.v1",
            Event::PaymentFailed { .. } => "order.payment_failed.v1",
            Event::Cancelled { .. } => "order.cancelled.v1",
            Event::Expired { .. } => "order.expired.v1",
            Event::RefundDecided { .. } => "order.refund_decided.v1",
            Event::Refunded { .. } => "order.refunded.v1",
            Event::CaptureDecided { .. } => "order.capture_decided.v1",
            Event::Captured { .. } => "order.captured.v1",
            Event::OperatorRefundDecided { .. } => "order.operator_refund_decided.v1",
            Event::OperatorRefunded { .. } => "order.operator_refunded.v1",
            Event::OperatorCancelled { .. } => "order.operator_cancelled.v1",
            Event::ActionRequired { .. } => "order.action_required.v1",
            Event::Disputed { .. } => "order.disputed.v1",
            Event::RefundedElsewhere { .. } => "order.refunded_elsewhere.v1",
        }
    }

    /// The stock movement this event causes on its order's lines, if any:
    /// the one rule the store applies.
    pub fn movement(&self) -> Option<Movement> {
        match self {
            Event::Placed { .. } => Some(Movement::Reserve),
            Event::Confirmed {
                reactivated: false, ..
            } => Some(Movement::Confirm),
            Event::Confirmed {
                reactivated: true, ..
            } => Some(Movement::Reclaim),
            Event::PaymentFailed { .. } | Event::Cancelled { .. } | Event::Expired { .. } => {
                Some(Movement::Release)
            }
            Event::OperatorCancelled { .. } => Some(Movement::Restock),
            Event::RefundDecided { .. }
            | Event::Refunded { .. }
            | Event::CaptureDecided { .. }
            | Event::Captured { .. }
            | Event::OperatorRefundDecided { .. }
            | Event::OperatorRefunded { .. }
            | Event::ActionRequired { .. } => None,
            Event::Disputed { .. } | Event::RefundedElsewhere { .. } => None,
        }
    }

    /// The event's payload without its tag, as stored in `events.data`.
    pub fn data(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut m)) => m.remove("data").unwrap_or_default(),
            _ => serde_json::Value::Null,
        }
    }

    /// Rebuilds an event from its stored type name and payload.
    pub fn from_parts(
        type_name: &str,
        data: serde_json::Value,
    ) -> Result<Event, serde_json::Error> {
        serde_json::from_value(serde_json::json!({ "type": type_name, "data": data }))
    }

    /// When the event happened.
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            Event::Placed { at, .. }
            | Event::Confirmed { at, .. }
            | Event::PaymentFailed { at, .. }
            | Event::Cancelled { at }
            | Event::Expired { at }
            | Event::RefundDecided { at, .. }
            | Event::Refunded { at, .. }
            | Event::CaptureDecided { at, .. }
            | Event::Captured { at, .. }
            | Event::OperatorRefundDecided { at, .. }
            | Event::OperatorRefunded { at, .. }
            | Event::OperatorCancelled { at, .. }
            | Event::ActionRequired { at, .. } => *at,
            Event::Disputed { at, .. } | Event::RefundedElsewhere { at, .. } => *at,
        }
    }
}

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

/// Decides which events a command produces against the current state.
pub fn decide(state: Option<&Order>, command: Command) -> Result<Vec<Event>, DomainError> {
    let Command::Place(place) = command else {
        let order = state.ok_or(DomainError::NotFound)?;
        return decide_existing(order, command);
    };
    if state.is_some() {
        return Err(DomainError::AlreadyExists);
    }
    if place.lines.is_empty() || place.lines.len() > MAX_LINES {
        return Err(DomainError::LineCount(place.lines.len()));
    }
    let currency = place.lines[0].2.currency;
    let mut total = Money::zero(currency);
    let mut lines: Vec<OrderLine> = Vec::with_capacity(place.lines.len());
    for (sku, quantity, price) in place.lines {
        if lines.iter().any(|l| l.sku == sku) {
            return Err(DomainError::DuplicateSku(sku));
        }
        total = total.checked_add(price.checked_mul(quantity.get())?)?;
        lines.push(OrderLine {
            sku,
            quantity,
            unit_price_minor: price.minor,
        });
    }
    lines.sort_by(|a, b| a.sku.cmp(&b.sku));
    Ok(vec![Event::Placed {
        order_id: place.order_id,
        account_id: place.account_id,
        lines,
        currency,
        total_minor: total.minor,
        shipping: place.shipping,
        expires_at: place.expires_at,
        at: place.placed_at,
    }])
}

fn decide_existing(order: &Order, command: Command) -> Result<Vec<Event>, DomainError> {
    use OrderState::*;
    let illegal = |action| {
        Err(DomainError::IllegalTransition {
            from: order.state,
            action,
        })
    };
    match (order.state, command) {
        (_, Command::Place(_)) => Err(DomainError::AlreadyExists),
        (
            _,
            Command::Paid {
                fact,
                units_gone,
                holdings,
            },
        ) => payment::decide_paid(order, fact, units_gone, &holdings),
        (_, Command::RecordRefund { payment_id, at }) => {
            payment::decide_refunded(order, &payment_id, at)
        }
        (Confirmed, Command::DecideCapture { at }) => Ok(payment::decide_capture(order, at)),
        (_, Command::DecideCapture { .. }) => illegal("capture the payment of"),
        (
            _,
            Command::RecordCapture {
                payment_id,
                amount_minor,
                at,
            },
        ) => payment::decide_captured(order, &payment_id, amount_minor, at),
        (_, Command::Dispute(fact)) => dispute::decide_disputed(order, fact),
        (
            _,
            Command::RecordRefundElsewhere {
                refund_id,
                payment_id,
                amount_minor,
                at,
            },
        ) => dispute::decide_refunded_elsewhere(order, refund_id, payment_id, amount_minor, at),
        (
            Confirmed,
            Command::RefundByOperator {
                key,
                amount_minor,
                at,
            },
        ) => crate::operator::decide_refund(order, &key, amount_minor, at),
        (_, Command::RefundByOperator { .. }) => illegal("refund"),
        (
            _,
            Command::CancelByOperator {
                shipped,
                reason,
                at,
            },
        ) => crate::operator::decide_cancel(order, shipped, &reason, at),
        (_, Command::RecordOperatorRefund { key, at }) => {
            crate::operator::decide_refunded(order, &key, at)
        }
        (
            _,
            Command::AwaitAction {
                payment_id,
                url,
                extension,
                at,
            },
        ) => Ok(crate::action::decide_await(
            order,
            &payment_id,
            &url,
            extension,
            at,
        )),
        (
            PaymentPending,
            Command::FailPayment {
                payment_id: Some(payment_id),
                abandoned: true,
                at,
                ..
            },
        ) if crate::action::awaits(order, &payment_id) => Ok(vec![Event::Expired { at }]),
        (
            PaymentPending,
            Command::FailPayment {
                payment_id,
                reason,
                at,
                ..
            },
        ) => Ok(vec![Event::PaymentFailed {
            payment_id,
            reason,
            at,
        }]),
        (PaymentFailed, Command::FailPayment { .. }) => Ok(vec![]),
        (PaymentPending, Command::Cancel { at }) => Ok(vec![Event::Cancelled { at }]),
        (PaymentPending, Command::Expire { at }) => {
            if at < order.expires_at {
                return Err(DomainError::NotYetExpired(order.expires_at));
            }
            Ok(vec![Event::Expired { at }])
        }
        (_, Command::FailPayment { .. }) => illegal("fail the payment of"),
        (_, Command::Cancel { .. }) => illegal("cancel"),
        (_, Command::Expire { .. }) => illegal("expire"),
    }
}

/// Folds one event into the state. Events are facts: `evolve` never refuses.
pub fn evolve(state: Option<Order>, event: &Event) -> Option<Order> {
    if let Event::Placed {
        order_id,
        account_id,
        lines,
        currency,
        total_minor,
        shipping,
        expires_at,
        at,
    } = event
    {
        return Some(Order {
            id: *order_id,
            account_id: *account_id,
            state: OrderState::PaymentPending,
            lines: lines.clone(),
            currency: *currency,
            total_minor: *total_minor,
            shipping: shipping.clone(),
            expires_at: *expires_at,
            created_at: *at,
            updated_at: *at,
            payment: None,
            refunds: Vec::new(),
            operator_refunds: Vec::new(),
            next_action: None,
            disputes: Vec::new(),
            version: 1,
        });
    }
    let mut order = state?;
    order.state = match event {
        Event::Placed { .. } => order.state,
        Event::Confirmed {
            payment_id,
            amount_minor,
            uncaptured,
            ..
        } => {
            order.payment = Some(PaymentRef {
                payment_id: payment_id.clone(),
                amount_minor: *amount_minor,
                capture: if *uncaptured {
                    Capture::Authorized
                } else {
                    Capture::Automatic
                },
            });
            OrderState::Confirmed
        }
        Event::RefundDecided { .. } | Event::Refunded { .. } => {
            payment::evolve_refund(&mut order, event);
            order.state
        }
        Event::CaptureDecided { .. } | Event::Captured { .. } => {
            payment::evolve_capture(&mut order, event);
            order.state
        }
        Event::OperatorRefundDecided { .. } | Event::OperatorRefunded { .. } => {
            crate::operator::evolve(&mut order, event);
            order.state
        }
        Event::OperatorCancelled { .. } => OrderState::Cancelled,
        Event::ActionRequired { .. } => {
            crate::action::evolve(&mut order, event);
            order.state
        }
        Event::Disputed { .. } => {
            dispute::evolve_disputed(&mut order, event);
            order.state
        }
        Event::RefundedElsewhere { .. } => order.state,
        Event::PaymentFailed { .. } => OrderState::PaymentFailed,
        Event::Cancelled { .. } => OrderState::Cancelled,
        Event::Expired { .. } => OrderState::Expired,
    };
    order.updated_at = event.at();
    order.version += 1;
    Some(order)
}

impl Order {
    /// Whether a matching payment arriving now would take the order's units
    /// back from available (an expired order): the store must then say
    /// whether they are still there (`Command::Paid { units_gone }`).
    pub fn payment_would_reclaim(&self) -> bool {
        self.state == OrderState::Expired
    }

    /// The refund decided for this payment, if any.
    pub fn refund_of(&self, payment_id: &str) -> Option<&RefundRef> {
        self.refunds.iter().find(|r| r.payment_id == payment_id)
    }
}

/// The state of an order with these events, in recorded order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> Option<Order> {
    events.into_iter().fold(None, evolve)
}

#[cfg(test)]
#[path = "order_tests.rs"]
mod tests;
