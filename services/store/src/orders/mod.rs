//! Orders: the event store, its orders projection, and the transactions
//! that change them (placing them is `placing`). Each commits the events, the projection, the stock
//! movements with their ledger rows and the outbox rows together.
//!
//! Layout:
//! - `transition.rs` — a command decided under the order's row lock, committed on the write path
//! - `projection.rs` — the projection's insert and update fragments of the write path's statement
//! - `row.rs` — a projection row with its lines, read back into an `Order`
//! - `reads.rs` — orders read: one, many, locked, streamed, an account's pages
//! - `history.rs` — an order's recorded events and saga steps

mod history;
pub(crate) mod projection;
mod reads;
pub(crate) mod row;
mod transition;

pub use history::{fold_history, history, stages, RecordedEvent, Stage};
pub(crate) use projection::insert_projections;
pub use reads::{
    list_for_account, load, load_many, oldest_pending_seconds, stream_all, PageEnd, BY_ID_SQL,
    LOCKED_SQL, ONE_SQL, PAGE_SQL,
};
pub(crate) use reads::{load_locked, load_many_locking, stream_with_history, Waiting};
pub(crate) use row::{select_orders, OrderRow};
pub use transition::{transition, transition_in, Transition};
