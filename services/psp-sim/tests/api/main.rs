//! End-to-end tests: each starts the real simulator in-process on port 0 and talks HTTP to it.
#![allow(clippy::unwrap_used)]

mod action;
mod cancel;
mod capture;
mod changes;
mod disputes;
mod expiry;
mod faults;
mod listing;
mod payments;
mod persistence;
mod processing;
mod refunds;
mod support;
mod webhooks;
