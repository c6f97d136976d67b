//! soldonce's wire contract: what travels on the bus and how it is named.
//! The CloudEvents 1.0 envelope and the metadata stored beside each event,
//! the versioned type names and subjects, typed decoding of a delivered
//! event, and the JSON Schemas of `proto/events`. Pure: no IO, no tokio,
//! no database, no NATS — `bus`, `store`, the services and the CLI share it.
//!
//! Layout:
//! - `envelope.rs` — `CloudEvent` (strict decoding), `Metadata` and its constructors, `wrap`
//! - `names.rs` — the `soldonce.` prefix, type names, subjects, sources
//! - `decode.rs` — a delivered event as an order or shipment event
//! - `inbox.rs` — the consumer side: inbox dedupe and dead letters, as a trait
//! - `schemas.rs` — the embedded schemas of `proto/events`

pub mod decode;
pub mod envelope;
pub mod inbox;
pub mod names;
pub mod schemas;

pub use decode::{decode, DecodeError, Decoded};
pub use envelope::{CloudEvent, Metadata};
pub use inbox::{DeadLetter, Inbox};
