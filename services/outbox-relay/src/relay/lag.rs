//! The clock of a row's commit → PubAck lag, which claiming and publishing
//! each measure a part of.

/// Seconds from `from` to `to`, never negative (the two clocks are the
/// database's and this process's: on one machine, one clock).
pub(super) fn seconds_between(
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> f64 {
    ((to - from).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}
