//! What an audit found and how patient it is: the report with its
//! violations, the options, full or incremental.

use serde::Serialize;
use std::time::Duration;

/// Most violations listed one by one; the rest are only counted.
pub const MAX_LISTED: usize = 1000;

/// One broken invariant, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub subject: String,
    pub detail: String,
}

/// How patient the audit is with work still in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditOptions {
    /// Outbox rows older than this are a violation.
    pub max_outbox_age: Duration,
    /// Confirmed orders without a shipment for longer than this are a violation.
    pub shipment_grace: Duration,
    /// Decided refunds not carried out for longer than this are a violation.
    pub compensation_grace: Duration,
    /// [`incremental`](crate::audit::incremental) makes a full pass when the
    /// last recorded one is older.
    pub full_every: Duration,
    /// A sequence number an audit did not see (a transaction in flight, or
    /// rolled back) is looked for again this long, then taken for a rollback.
    pub hole_patience: Duration,
    /// [`incremental`](crate::audit::incremental) checks the changed orders
    /// this many at a time, each group in a snapshot of its own (short
    /// snapshots hold back no vacuum).
    pub chunk: usize,
    /// The share of its time [`incremental`](crate::audit::incremental)
    /// spends working, in (0, 1]: after each group it rests
    /// `work × (1 / pace − 1)`, as autovacuum's
    /// cost delay does, so a periodic audit never takes more than its share
    /// of the machine from a flash sale (it lags, and catches up after).
    pub pace: f64,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            max_outbox_age: Duration::from_secs(300),
            shipment_grace: Duration::from_secs(600),
            compensation_grace: Duration::from_secs(60),
            full_every: Duration::from_secs(3600),
            hole_patience: Duration::from_secs(600),
            chunk: 2000,
            pace: 1.0,
        }
    }
}

/// A full pass, or the orders and ledger rows that changed since the last
/// recorded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditKind {
    #[default]
    Full,
    Incremental,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Full => "full",
            AuditKind::Incremental => "incremental",
        }
    }
}

/// The audit's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub kind: AuditKind,
    /// Incremental: the orders checked are those with events past this position.
    pub from_position: Option<i64>,
    /// The highest event position the audit's snapshot held.
    pub to_position: i64,
    pub skus: u64,
    pub orders: u64,
    pub events: u64,
    pub payments: u64,
    pub outbox_backlog: i64,
    pub outbox_oldest_seconds: f64,
    /// Every violation found; at most [`MAX_LISTED`] are in `violations`.
    pub violation_count: u64,
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// Whether every invariant holds.
    pub fn clean(&self) -> bool {
        self.violation_count == 0
    }

    /// Records a violation (listed while fewer than [`MAX_LISTED`] are).
    pub fn flag(
        &mut self,
        check: &'static str,
        subject: impl Into<String>,
        detail: impl Into<String>,
    ) {
        self.violation_count += 1;
        if self.violations.len() < MAX_LISTED {
            self.violations.push(Violation {
                check,
                subject: subject.into(),
                detail: detail.into(),
            });
        }
    }
}
