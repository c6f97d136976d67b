//! The test harness: one private PostgreSQL and one private NATS JetStream
//! server per test process, started from PATH on first use; a fresh
//! database per test, cloned from a migrated template; the real services
//! started in-process on port 0; typed helpers for their APIs.

#[path = "harness/app.rs"]
pub mod app;
#[path = "harness/poll.rs"]
pub mod poll;
#[path = "harness/relay.rs"]
pub mod relay;
#[path = "harness/saga.rs"]
pub mod saga;
#[path = "harness/servers.rs"]
pub mod servers;
#[path = "harness/system.rs"]
pub mod system;

pub use app::TestApp;
pub use poll::eventually;
