//! The pure heart of soldonce: orders as a state machine driven by
//! `decide`/`evolve`, stock buckets, money and quantities with checked
//! arithmetic. This crate must never do IO: no tokio, no sqlx, no NATS, no
//! clock reads — time comes in through commands.

pub mod money;
pub mod order;
pub mod payment;
pub mod shipment;
pub mod stock;

pub use money::{Currency, Money, MoneyError};
pub use order::{
    decide, evolve, fold, Command, DomainError, Event, Order, OrderLine, OrderState, PaymentRef,
    PlaceOrder, Shipping,
};
pub use payment::{PaidFact, PspStatus, RefundReason, RefundRef};
pub use stock::{Buckets, Quantity, Sku, StockError};
