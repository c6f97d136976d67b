//! End-to-end tests: each starts the real simulator in-process on port 0 and talks HTTP to it.
#![allow(clippy::unwrap_used)]

mod faults;
mod listing;
mod payments;
mod persistence;
mod processing;
mod refunds;
mod support;
mod webhooks;
