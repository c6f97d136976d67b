//! The services' Prometheus metrics, scraped before and after a phase: the
//! stages' latency histograms (p50/p99 of what was observed in between,
//! interpolated within buckets as `histogram_quantile` does) and the
//! consumers' messages per batch and per transaction.

use serde::Serialize;
use std::collections::BTreeMap;

/// The histograms whose p50/p99 a saga report gives, by metric name.
const STAGES: &[&str] = &[
    "soldonce_checkout_queue_wait_seconds",
    "soldonce_checkout_group_seconds",
    "soldonce_outbox_commit_to_claim_seconds",
    "soldonce_outbox_commit_to_puback_seconds",
    "soldonce_consumer_wait_seconds",
    "soldonce_consumer_handle_seconds",
    "soldonce_consumer_transaction_seconds",
    "soldonce_psp_latency_seconds",
];

/// One scrape of several services: every sample line of interest, keyed by
/// the service, the metric's name and its labels.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    samples: BTreeMap<(String, String, String), f64>,
}

impl Scrape {
    /// Reads `/metrics` from each `(service, url)`; a service that does not
    /// answer contributes nothing (its figures are then missing, not wrong).
    pub async fn take(client: &reqwest::Client, services: &[(String, String)]) -> Scrape {
        let mut scrape = Scrape::default();
        for (service, url) in services {
            let text = match client.get(url).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => continue,
            };
            scrape.add(service, &text);
        }
        scrape
    }

    /// Adds one service's exposition text.
    pub fn add(&mut self, service: &str, text: &str) {
        for line in text.lines().filter(|l| l.starts_with("soldonce_")) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            self.samples.insert(
                (service.to_owned(), name.to_owned(), labels.to_owned()),
                value,
            );
        }
    }

    fn delta(&self, before: &Scrape, key: &(String, String, String)) -> f64 {
        self.samples.get(key).copied().unwrap_or(0.0)
            - before.samples.get(key).copied().unwrap_or(0.0)
    }

    /// Each stage histogram's p50/p99 over what it observed since `before`.
    pub fn stages(&self, before: &Scrape) -> Vec<Stage> {
        // (service, metric, labels without le) -> [(le, cumulative count)]
        let mut histograms: BTreeMap<(String, String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for key in self.samples.keys() {
            let (service, name, labels) = key;
            let Some(metric) = name.strip_suffix("_bucket") else {
                continue;
            };
            if !STAGES.contains(&metric) {
                continue;
            }
            let (le, rest) = split_le(labels);
            let Some(le) = le else { continue };
            histograms
                .entry((service.clone(), metric.to_owned(), rest))
                .or_default()
                .push((le, self.delta(before, key)));
        }
        histograms
            .into_iter()
            .filter_map(|((_, metric, labels), mut buckets)| {
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                let observed = buckets.last().map_or(0.0, |b| b.1);
                (observed > 0.0).then(|| Stage {
                    stage: stage_name(&metric, &labels),
                    p50_ms: quantile(&buckets, 0.5) * 1000.0,
                    p99_ms: quantile(&buckets, 0.99) * 1000.0,
                    observed: observed.round() as u64,
                })
            })
            .collect()
    }

    /// Each consumer's mean messages per batch and per transaction since `before`.
    pub fn messages(&self, before: &Scrape) -> Vec<Messages> {
        let mut by_consumer: BTreeMap<String, [f64; 4]> = BTreeMap::new();
        for key in self.samples.keys() {
            let slot = match key.1.as_str() {
                "soldonce_consumer_batch_size_sum" => 0,
                "soldonce_consumer_batch_size_count" => 1,
                "soldonce_consumer_transaction_size_sum" => 2,
                "soldonce_consumer_transaction_size_count" => 3,
                _ => continue,
            };
            let consumer = label(&key.2, "consumer").unwrap_or_default();
            by_consumer.entry(consumer).or_default()[slot] += self.delta(before, key);
        }
        by_consumer
            .into_iter()
            .filter(|(_, d)| d[1] > 0.0 || d[3] > 0.0)
            .map(|(consumer, d)| Messages {
                consumer,
                per_batch: (d[1] > 0.0).then(|| d[0] / d[1]),
                per_transaction: (d[3] > 0.0).then(|| d[2] / d[3]),
            })
            .collect()
    }

    /// A counter's increase since `before` by the value of `label`, for one metric.
    pub fn counts_by(
        &self,
        before: &Scrape,
        metric: &str,
        label_name: &str,
    ) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for key in self.samples.keys().filter(|k| k.1 == metric) {
            let value = label(&key.2, label_name).unwrap_or_default();
            *out.entry(value).or_insert(0) += self.delta(before, key).round() as u64;
        }
        out
    }
}

/// One stage's latency over a phase.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// The histogram without `soldonce_` and `_seconds`, with its labels, e.g. `consumer_wait{consumer="payments"}`.
    pub stage: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub observed: u64,
}

/// One consumer's messages per batch and per transaction over a phase.
#[derive(Debug, Clone, Serialize)]
pub struct Messages {
    pub consumer: String,
    pub per_batch: Option<f64>,
    pub per_transaction: Option<f64>,
}

fn stage_name(metric: &str, labels: &str) -> String {
    let name = metric
        .trim_start_matches("soldonce_")
        .trim_end_matches("_seconds");
    if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    }
}

/// The `le` bound (`+Inf` as infinity) and the other labels.
fn split_le(labels: &str) -> (Option<f64>, String) {
    let mut le = None;
    let mut rest = Vec::new();
    for part in labels.split(',').filter(|p| !p.is_empty()) {
        match part.strip_prefix("le=") {
            Some(v) => {
                le = match v.trim_matches('"') {
                    "+Inf" => Some(f64::INFINITY),
                    v => v.parse().ok(),
                }
            }
            None => rest.push(part),
        }
    }
    (le, rest.join(","))
}

fn label(labels: &str, name: &str) -> Option<String> {
    labels.split(',').find_map(|p| {
        p.strip_prefix(name)
            .and_then(|v| v.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_owned())
    })
}

/// The `q` quantile of cumulative `buckets` (sorted by bound), linear within
/// the bucket it falls in; in the `+Inf` bucket, the last finite bound.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return lower;
            }
            let within = (count - below).max(1e-9);
            return lower + (le - lower) * ((rank - below) / within);
        }
        lower = if le.is_finite() { le } else { lower };
        below = count;
    }
    lower
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "soldonce_outbox_commit_to_puback_seconds_bucket{le=\"0.01\"} 10\n\
        soldonce_outbox_commit_to_puback_seconds_bucket{le=\"0.02\"} 10\n\
        soldonce_outbox_commit_to_puback_seconds_bucket{le=\"+Inf\"} 10\n\
        soldonce_consumer_batch_size_sum{consumer=\"payments\"} 4\n\
        soldonce_consumer_batch_size_count{consumer=\"payments\"} 2\n";
    const AFTER: &str = "soldonce_outbox_commit_to_puback_seconds_bucket{le=\"0.01\"} 60\n\
        soldonce_outbox_commit_to_puback_seconds_bucket{le=\"0.02\"} 110\n\
        soldonce_outbox_commit_to_puback_seconds_bucket{le=\"+Inf\"} 110\n\
        soldonce_consumer_batch_size_sum{consumer=\"payments\"} 34\n\
        soldonce_consumer_batch_size_count{consumer=\"payments\"} 8\n";

    #[test]
    fn quantiles_come_from_what_was_observed_between_the_scrapes() {
        let (mut before, mut after) = (Scrape::default(), Scrape::default());
        before.add("outbox-relay", BEFORE);
        after.add("outbox-relay", AFTER);
        let stages = after.stages(&before);
        assert_eq!(stages.len(), 1, "{stages:?}");
        let s = &stages[0];
        assert_eq!(
            (s.stage.as_str(), s.observed),
            ("outbox_commit_to_puback", 100)
        );
        // 50 of 100 fall in the first bucket: the median is its upper bound.
        assert!((s.p50_ms - 10.0).abs() < 1e-6, "{s:?}");
        // the 99th is 49 of the second bucket's 50, interpolated.
        assert!((s.p99_ms - 19.8).abs() < 1e-6, "{s:?}");
        let m = after.messages(&before);
        assert_eq!(m[0].per_batch, Some(5.0));
    }
}
