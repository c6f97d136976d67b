//! The load generator driven from other commands (the demo's flash sale,
//! the benches) rather than from `soldonce load`'s arguments.

use super::{measure, LoadArgs, Report};
use crate::CliError;
use std::time::Duration;

/// A flash sale: `buyers` concurrent buyers of one unit of `sku`, checked against the database.
pub async fn flash_sale(
    pool: &sqlx::PgPool,
    url: &str,
    token: &str,
    sku: &str,
    buyers: usize,
) -> Result<Report, CliError> {
    let args = LoadArgs {
        url: url.to_owned(),
        token: token.to_owned(),
        sku: sku.to_owned(),
        sku_count: 1,
        quantity: 1,
        connections: Some(buyers),
        requests: Some(buyers as u64),
        rate: None,
        duration: None,
        no_verify: false,
        history: None,
    };
    measure(&args, Some(pool)).await
}

/// How a benchmark drives checkout: on a schedule, or as fast as answers come.
#[derive(Debug, Clone, Copy)]
pub enum Drive {
    /// `rate` orders per second for `duration`, whatever the latency.
    Open { rate: f64, duration: Duration },
    /// `connections` buyers, each sending its next order when the last is answered, `requests` in all.
    Closed { connections: usize, requests: u64 },
}

/// Drives checkout at `url` as `soldonce load` does, one unit per order of
/// `sku` (of `<sku>-0` … `<sku>-(N-1)` at random with `sku_count` N > 1);
/// the accepted orders are counted in `verify` when given.
pub async fn drive(
    url: &str,
    token: &str,
    (sku, sku_count): (&str, u32),
    drive: Drive,
    verify: Option<&sqlx::PgPool>,
) -> Result<Report, CliError> {
    let (connections, requests, rate, duration) = match drive {
        Drive::Open { rate, duration } => {
            (None, None, Some(rate.to_string()), Some(duration.into()))
        }
        Drive::Closed {
            connections,
            requests,
        } => (Some(connections), Some(requests), None, None),
    };
    let args = LoadArgs {
        url: url.to_owned(),
        token: token.to_owned(),
        sku: sku.to_owned(),
        sku_count,
        quantity: 1,
        connections,
        requests,
        rate,
        duration,
        no_verify: verify.is_none(),
        history: None,
    };
    measure(&args, verify).await
}
