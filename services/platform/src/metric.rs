//! What each metric means, declared once per crate beside the code that
//! records it (`pub const METRICS: &[Metric]`) and given to the recorder
//! when a service starts ([`describe`]), so `/metrics` has a `# HELP` line
//! for every family. The end-to-end tests check every metric recorded in
//! the sources is declared, and every scraped family has its line.

/// How a metric is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, how it is recorded, and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Metric {
    /// A counter named `name`, meaning `help`.
    pub const fn counter(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Counter,
            help,
        }
    }

    /// A gauge named `name`, meaning `help`.
    pub const fn gauge(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Gauge,
            help,
        }
    }

    /// A histogram named `name`, meaning `help`.
    pub const fn histogram(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Histogram,
            help,
        }
    }
}

/// The metrics platform records for every service.
pub const METRICS: &[Metric] = &[
    Metric::gauge(
        "soldonce_build_info",
        "Always 1, labelled with the service and the version of the build running.",
    ),
    Metric::gauge(
        "soldonce_runtime_workers",
        "Worker threads of the process's async runtime (TOKIO_WORKER_THREADS).",
    ),
    Metric::histogram(
        "http_server_request_duration_seconds",
        "Duration of HTTP requests served, by route template, method and status code.",
    ),
];

/// Gives every metric of `lists` its description, installing the
/// process's recorder first (a description given before it is lost).
pub fn describe(lists: &[&[Metric]]) {
    crate::ops::metrics_handle();
    for m in lists.iter().flat_map(|list| list.iter()) {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
}
