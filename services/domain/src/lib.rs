//! The pure heart of soldonce: orders as a state machine driven by
//! `decide`/`evolve`, stock buckets, money and quantities with checked
//! arithmetic. This crate must never do IO: no tokio, no sqlx, no NATS, no
//! clock reads — time comes in through commands.
//!
//! Layout:
//! - `order.rs` — orders: commands, events, `decide`/`evolve`/`fold`, the stock movement per event
//! - `payment.rs` — what a PSP fact does to an order: attach, refund, record the refund
//! - `dispute.rs` — chargebacks recorded on the order, once per dispute
//! - `limits.rs` — what one account may hold, at placing and at a late payment's revival
//! - `shipment.rs` — shipments: `decide`/`evolve`, one step at a time
//! - `stock.rs` — SKUs, quantities, the three buckets and the movements between them
//! - `money.rs` — currencies and checked amounts

pub mod action;
pub mod dispute;
pub mod limits;
pub mod money;
pub mod operator;
pub mod order;
pub mod payment;
pub mod shipment;
pub mod stock;

pub use dispute::{DisputeFact, DisputeRef};
pub use money::{Currency, Money, MoneyError};
pub use order::{
    decide, evolve, fold, Capture, Command, DomainError, Event, Order, OrderLine, OrderState,
    PaymentRef, PlaceOrder, Shipping,
};
pub use payment::{PaidFact, PspStatus, RefundReason, RefundRef};
pub use stock::{Buckets, Movement, Quantity, Sku, StockError};
