//! soldonce's end-to-end tests, one binary: real PostgreSQL and NATS
//! servers started privately by the harness, the real services in-process.

mod bus;
mod chaos;
mod checkout;
mod expiry;
mod fulfillment;
mod model;
mod ops;
mod payments;
