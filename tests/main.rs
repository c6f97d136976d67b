//! soldonce's end-to-end tests, one binary: real PostgreSQL and NATS
//! servers started privately by the harness, the real services in-process.

mod bus;
mod checkout;
mod expiry;
mod fulfillment;
mod ops;
mod payments;
