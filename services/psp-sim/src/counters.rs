//! Counters for `/metrics`, one set per application (tests run several apps in one process, so
//! no global recorder), rendered by hand in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::{CancellationReason, PaymentStatus};

/// A keyed change to a payment, for counting replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// `POST /v1/payments/{id}/capture`.
    Capture,
    /// `POST /v1/payments/{id}/cancel`.
    Cancel,
}

/// A fault the simulator injected on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A POST answered 503 because of `fail_first`.
    FailFirst,
    /// A payment declined because of `decline_rate`.
    Decline,
    /// A reply withheld because of `lose_reply_rate`.
    LoseReply,
    /// A webhook never sent because of `drop_webhook_rate`.
    DropWebhook,
    /// An extra copy of a webhook because of `webhook_duplicates`.
    DuplicateWebhook,
    /// A batch of webhooks sent newest first because of `webhook_reorder`.
    ReorderWebhooks,
    /// A payment that started as `processing` because of `processing_rate`.
    Processing,
    /// A payment that started as `requires_action` because of `action_required_rate`.
    ActionRequired,
    /// A request held back, before it was handled, because of `latency_ms`.
    Latency,
}

impl Fault {
    const ALL: [Fault; 9] = [
        Fault::FailFirst,
        Fault::Decline,
        Fault::LoseReply,
        Fault::DropWebhook,
        Fault::DuplicateWebhook,
        Fault::ReorderWebhooks,
        Fault::Processing,
        Fault::ActionRequired,
        Fault::Latency,
    ];

    fn label(self) -> &'static str {
        match self {
            Fault::FailFirst => "fail_first",
            Fault::Decline => "decline",
            Fault::LoseReply => "lose_reply",
            Fault::DropWebhook => "drop_webhook",
            Fault::DuplicateWebhook => "duplicate_webhook",
            Fault::ReorderWebhooks => "reorder_webhooks",
            Fault::Processing => "processing",
            Fault::ActionRequired => "action_required",
            Fault::Latency => "latency",
        }
    }
}

/// Monotonic counters behind `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    payments_succeeded: AtomicU64,
    payments_failed: AtomicU64,
    payment_replays: AtomicU64,
    refunds: AtomicU64,
    refund_replays: AtomicU64,
    capture_replays: AtomicU64,
    cancel_replays: AtomicU64,
    captures: AtomicU64,
    captures_partial: AtomicU64,
    cancels_requested: AtomicU64,
    cancels_abandoned: AtomicU64,
    cancels_expired: AtomicU64,
    disputes: AtomicU64,
    webhooks_acknowledged: AtomicU64,
    webhooks_abandoned: AtomicU64,
    webhook_attempts_ok: AtomicU64,
    webhook_attempts_failed: AtomicU64,
    connections_accepted: AtomicU64,
    faults: [AtomicU64; Fault::ALL.len()],
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Counters {
    /// A payment reached this status: at creation, or on a later change. Only `succeeded`
    /// and `failed` count here; cancellations count in [`Counters::payment_canceled`].
    pub fn payment_outcome(&self, status: PaymentStatus) {
        match status {
            PaymentStatus::Succeeded => bump(&self.payments_succeeded, 1),
            PaymentStatus::Failed => bump(&self.payments_failed, 1),
            PaymentStatus::RequiresAction
            | PaymentStatus::Processing
            | PaymentStatus::RequiresCapture
            | PaymentStatus::Canceled => {}
        }
    }

    /// A payment captured; `partial` when less than was authorized.
    pub fn payment_captured(&self, partial: bool) {
        bump(&self.captures, 1);
        if partial {
            bump(&self.captures_partial, 1);
        }
    }

    /// A payment canceled, for this reason.
    pub fn payment_canceled(&self, reason: CancellationReason) {
        let counter = match reason {
            CancellationReason::Requested => &self.cancels_requested,
            CancellationReason::Abandoned => &self.cancels_abandoned,
            CancellationReason::Expired => &self.cancels_expired,
        };
        bump(counter, 1);
    }

    /// A new dispute.
    pub fn dispute_created(&self) {
        bump(&self.disputes, 1);
    }

    /// A capture or cancel answered from an earlier key.
    pub fn change_replayed(&self, change: Change) {
        match change {
            Change::Capture => bump(&self.capture_replays, 1),
            Change::Cancel => bump(&self.cancel_replays, 1),
        }
    }

    /// A payment POST answered from an earlier key.
    pub fn payment_replayed(&self) {
        bump(&self.payment_replays, 1);
    }

    /// A new refund.
    pub fn refund_created(&self) {
        bump(&self.refunds, 1);
    }

    /// A refund POST answered from an earlier key.
    pub fn refund_replayed(&self) {
        bump(&self.refund_replays, 1);
    }

    /// One webhook delivery attempt and whether the receiver answered 2xx.
    pub fn webhook_attempted(&self, acknowledged: bool) {
        if acknowledged {
            bump(&self.webhook_attempts_ok, 1);
        } else {
            bump(&self.webhook_attempts_failed, 1);
        }
    }

    /// A webhook delivery ended: acknowledged, or given up after the retry budget.
    pub fn webhook_finished(&self, acknowledged: bool) {
        if acknowledged {
            bump(&self.webhooks_acknowledged, 1);
        } else {
            bump(&self.webhooks_abandoned, 1);
        }
    }

    /// A client opened a TCP connection to the API.
    pub fn connection_accepted(&self) {
        bump(&self.connections_accepted, 1);
    }

    /// `times` injections of this fault.
    pub fn fault_injected(&self, fault: Fault, times: u64) {
        if let Some(index) = Fault::ALL.iter().position(|f| *f == fault) {
            bump(&self.faults[index], times);
        }
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        family(
            &mut out,
            "psp_sim_payments_total",
            "Payments by outcome, counted when it is known (at creation, or on settling).",
            &[
                ("status=\"succeeded\"", read(&self.payments_succeeded)),
                ("status=\"failed\"", read(&self.payments_failed)),
            ],
        );
        family(
            &mut out,
            "psp_sim_idempotent_replays_total",
            "POSTs answered from an earlier idempotency key.",
            &[
                ("resource=\"payment\"", read(&self.payment_replays)),
                ("resource=\"refund\"", read(&self.refund_replays)),
                ("resource=\"capture\"", read(&self.capture_replays)),
                ("resource=\"cancel\"", read(&self.cancel_replays)),
            ],
        );
        self.render_changes(&mut out);
        family(
            &mut out,
            "psp_sim_refunds_total",
            "Refunds created.",
            &[("", read(&self.refunds))],
        );
        family(
            &mut out,
            "psp_sim_webhooks_total",
            "Webhook deliveries finished, by outcome.",
            &[
                (
                    "outcome=\"acknowledged\"",
                    read(&self.webhooks_acknowledged),
                ),
                ("outcome=\"abandoned\"", read(&self.webhooks_abandoned)),
            ],
        );
        family(
            &mut out,
            "psp_sim_webhook_attempts_total",
            "Webhook delivery attempts, by result.",
            &[
                ("result=\"acknowledged\"", read(&self.webhook_attempts_ok)),
                ("result=\"failed\"", read(&self.webhook_attempts_failed)),
            ],
        );
        family(
            &mut out,
            "psp_sim_connections_accepted_total",
            "TCP connections accepted; a client that keeps its connections alive opens few.",
            &[("", read(&self.connections_accepted))],
        );
        let faults: Vec<(String, u64)> = Fault::ALL
            .iter()
            .zip(&self.faults)
            .map(|(fault, count)| (format!("fault=\"{}\"", fault.label()), read(count)))
            .collect();
        let faults: Vec<(&str, u64)> = faults.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        family(
            &mut out,
            "psp_sim_faults_injected_total",
            "Faults injected on purpose, by kind.",
            &faults,
        );
        out
    }
}

impl Counters {
    fn render_changes(&self, out: &mut String) {
        family(
            out,
            "psp_sim_captures_total",
            "Payments captured (requires_capture to succeeded), by whether all that was authorized was taken.",
            &[
                (
                    "kind=\"full\"",
                    read(&self.captures).saturating_sub(read(&self.captures_partial)),
                ),
                ("kind=\"partial\"", read(&self.captures_partial)),
            ],
        );
        family(
            out,
            "psp_sim_cancellations_total",
            "Payments canceled, by cancellation_reason.",
            &[
                ("reason=\"requested\"", read(&self.cancels_requested)),
                ("reason=\"abandoned\"", read(&self.cancels_abandoned)),
                ("reason=\"expired\"", read(&self.cancels_expired)),
            ],
        );
        family(
            out,
            "psp_sim_disputes_total",
            "Disputes opened.",
            &[("", read(&self.disputes))],
        );
    }
}

fn family(out: &mut String, name: &str, help: &str, samples: &[(&str, u64)]) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_prometheus_text() {
        let counters = Counters::default();
        counters.payment_outcome(PaymentStatus::Succeeded);
        counters.payment_outcome(PaymentStatus::Succeeded);
        counters.payment_outcome(PaymentStatus::Processing);
        counters.fault_injected(Fault::DuplicateWebhook, 2);
        counters.refund_created();
        counters.payment_captured(true);
        counters.payment_captured(false);
        counters.payment_canceled(CancellationReason::Expired);
        counters.dispute_created();
        counters.change_replayed(Change::Cancel);
        let text = counters.render();
        for sample in [
            "psp_sim_captures_total{kind=\"full\"} 1\n",
            "psp_sim_captures_total{kind=\"partial\"} 1\n",
            "psp_sim_cancellations_total{reason=\"expired\"} 1\n",
            "psp_sim_cancellations_total{reason=\"requested\"} 0\n",
            "psp_sim_disputes_total 1\n",
            "psp_sim_idempotent_replays_total{resource=\"cancel\"} 1\n",
            "# HELP psp_sim_disputes_total Disputes opened.\n",
        ] {
            assert!(text.contains(sample), "{sample} in {text}");
        }
        assert!(
            text.contains("psp_sim_payments_total{status=\"succeeded\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("psp_sim_payments_total{status=\"failed\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("psp_sim_refunds_total 1\n"), "{text}");
        assert!(
            text.contains("psp_sim_faults_injected_total{fault=\"duplicate_webhook\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE psp_sim_webhooks_total counter\n"),
            "{text}"
        );
    }
}
