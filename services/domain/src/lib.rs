//! The pure heart of soldonce: orders as a state machine driven by
//! `decide`/`evolve`, stock buckets, money and quantities with checked
//! arithmetic. This crate must never do IO: no tokio, no sqlx, no NATS, no
//! clock reads — time comes in through commands.
//!
//! Layout:
//! - `order.rs` — orders: `decide`/`evolve`/`fold`, routing each command and event to its decider
//! - `state.rs` — an order's state and the payments, refunds, actions and disputes recorded on it
//! - `command.rs` — what can be asked of an order
//! - `event.rs` — what happened to an order: type names, stored form, the stock movement per event
//! - `error.rs` — why a command was refused
//! - `payment.rs` — what a PSP fact does to an order: attach, refund, record the refund
//! - `dispute.rs` — chargebacks recorded on the order, once per dispute
//! - `limits.rs` — what one account may hold, at placing and at a late payment's revival
//! - `operator.rs` — an operator's refund or cancel of a confirmed order
//! - `action.rs` — 3-D Secure: an order waiting for the buyer's action
//! - `shipment.rs` — shipments: `decide`/`evolve`, one step at a time
//! - `stock.rs` — SKUs, quantities, the three buckets and the movements between them
//! - `money.rs` — currencies and checked amounts

pub mod action;
pub mod command;
pub mod dispute;
pub mod error;
pub mod event;
pub mod limits;
pub mod money;
pub mod operator;
pub mod order;
pub mod payment;
pub mod shipment;
pub mod state;
pub mod stock;

pub use command::{Command, PlaceOrder};
pub use dispute::{DisputeFact, DisputeRef};
pub use error::DomainError;
pub use event::Event;
pub use money::{Currency, Money, MoneyError};
pub use order::{decide, evolve, fold};
pub use payment::{PaidFact, PspStatus, RefundReason, RefundRef};
pub use state::{Capture, Order, OrderLine, OrderState, PaymentRef, Shipping};
pub use stock::{Buckets, Movement, Quantity, Sku, StockError};
