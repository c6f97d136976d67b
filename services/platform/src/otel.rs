//! OpenTelemetry traces, exported over OTLP (`http/protobuf`) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, off otherwise.
//!
//! An order crosses processes at a handful of places: the HTTP request
//! into checkout, each event the relay publishes, each delivery a consumer
//! handles, the PSP call, psp-sim's answer and its webhook. Each crossing
//! is one [`Hop`]: a span whose id is chosen when the hop starts
//! ([`TraceParent::child`] of the `traceparent` it continues), so the
//! `traceparent` sent on (in an HTTP header, a NATS header, or an event's
//! metadata written to the outbox) names exactly the span that is exported
//! when the hop ends. One order is one trace, parent links intact, whether
//! or not a hop's process exports: the ids travel the same way when
//! tracing is off, and the spans are simply not recorded.
//!
//! The standard variables are honoured by the OpenTelemetry SDK itself:
//! `OTEL_SERVICE_NAME` (default: the binary's name), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*`
//! (batching), `OTEL_TRACES_SAMPLER`/`_ARG`, `OTEL_SDK_DISABLED`.

use crate::config::{self, ConfigError};
use crate::trace::TraceParent;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::SystemTime;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

const ENDPOINT: config::Var = config::var(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "where OpenTelemetry spans go over OTLP http/protobuf, e.g. http://collector:4318 (/v1/traces is appended); unset: no traces",
);
const TRACES_ENDPOINT: config::Var = config::var(
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "the full OTLP traces URL, used as given (over OTEL_EXPORTER_OTLP_ENDPOINT)",
);
const PROTOCOL: config::Var = config::var(
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "the OTLP protocol: only http/protobuf (the default) is accepted",
)
.default_shown_as("http/protobuf");
const TRACES_PROTOCOL: config::Var = config::var(
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "the OTLP protocol for traces (over OTEL_EXPORTER_OTLP_PROTOCOL): only http/protobuf",
)
.default_shown_as("http/protobuf");
const SDK_DISABLED: config::Var = config::var(
    "OTEL_SDK_DISABLED",
    "true turns tracing off even with an endpoint set",
)
.default_shown_as("false");
const TRACES_EXPORTER: config::Var =
    config::var("OTEL_TRACES_EXPORTER", "otlp, or none to turn tracing off")
        .default_shown_as("otlp");

/// Where spans go, when they go anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exporting {
    /// The endpoint as configured (for the start-up log line).
    pub endpoint: String,
}

/// Reads the OTLP settings: `None` when no endpoint is set (or the SDK is
/// disabled); an error for a protocol other than `http/protobuf` or an
/// endpoint that is not an http(s) URL.
pub fn settings() -> Result<Option<Exporting>, ConfigError> {
    let traces = TRACES_ENDPOINT.optional()?;
    let base = ENDPOINT.optional()?;
    let protocol = match TRACES_PROTOCOL.optional()? {
        Some(p) => (TRACES_PROTOCOL.name(), Some(p)),
        None => (PROTOCOL.name(), PROTOCOL.optional()?),
    };
    let disabled = SDK_DISABLED.optional()?;
    let exporter = TRACES_EXPORTER.optional()?;
    if let (name, Some(p)) = &protocol {
        if p.trim() != "http/protobuf" {
            return Err(ConfigError::new(
                name,
                format!("{p:?}: soldonce exports traces over http/protobuf only (the OTLP default for HTTP); use a collector's 4318 port"),
            ));
        }
    }
    match exporter.as_deref().map(str::trim) {
        None | Some("otlp") | Some("none") => {}
        Some(other) => {
            return Err(ConfigError::new(
                TRACES_EXPORTER.name(),
                format!("{other:?}: only otlp (or none) is supported"),
            ))
        }
    }
    let (name, endpoint) = match (traces, base) {
        (Some(t), _) => (TRACES_ENDPOINT.name(), t),
        (_, Some(b)) => (ENDPOINT.name(), b),
        _ => return Ok(None),
    };
    let endpoint = endpoint.trim().to_owned();
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        || endpoint.split("://").nth(1).is_none_or(str::is_empty)
    {
        return Err(ConfigError::new(
            name,
            format!("{endpoint:?} is not an http:// or https:// URL"),
        ));
    }
    let off = disabled.is_some_and(|d| d.trim().eq_ignore_ascii_case("true"))
        || exporter.is_some_and(|e| e.trim() == "none");
    Ok((!off).then_some(Exporting { endpoint }))
}

/// Starts exporting spans for `service` (a no-op when `exporting` is
/// `None`, or on a second call). The SDK batches on a thread of its own.
pub fn start(service: &'static str, exporting: Option<&Exporting>) -> Result<(), String> {
    let Some(exporting) = exporting else {
        return Ok(());
    };
    if TRACER.get().is_some() {
        return Ok(());
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTLP exporter to {}: {e}", exporting.endpoint))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("soldonce");
    let _ = PROVIDER.set(provider);
    let _ = TRACER.set(tracer);
    tracing::info!(endpoint = %exporting.endpoint, "exporting traces over OTLP");
    Ok(())
}

/// How long stopping waits for the collector to take the last spans: a
/// collector that hangs never holds a stopping service past its grace.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Exports what is still batched and stops (at the end of `main`), waiting
/// at most `FLUSH_TIMEOUT`.
pub fn shutdown() {
    let Some(provider) = PROVIDER.get().cloned() else {
        return;
    };
    let (done, flushed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(provider.shutdown());
    });
    match flushed.recv_timeout(FLUSH_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "flushing the last spans failed"),
        Err(_) => tracing::warn!(
            "the trace collector did not take the last spans within 2 s; they are dropped"
        ),
    }
}

/// Whether spans are being exported.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// What a hop is, in OpenTelemetry's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An HTTP request handled.
    Server,
    /// An HTTP request made.
    Client,
    /// A message published.
    Producer,
    /// A message handled.
    Consumer,
}

/// One crossing of an order's trace into, or out of, this process; the
/// span is recorded when the hop is dropped (or [`Hop::end`]ed).
#[derive(Debug)]
pub struct Hop {
    name: Cow<'static, str>,
    kind: Kind,
    parent: Option<TraceParent>,
    me: TraceParent,
    state: Option<String>,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    error: Option<String>,
}

impl Hop {
    /// A hop continuing `parent` (a new trace when there is none).
    pub fn start(
        kind: Kind,
        name: impl Into<Cow<'static, str>>,
        parent: Option<TraceParent>,
    ) -> Hop {
        Hop {
            name: name.into(),
            kind,
            parent,
            me: parent.map_or_else(TraceParent::start, |p| p.child()),
            state: None,
            start: SystemTime::now(),
            attributes: vec![],
            error: None,
        }
    }

    /// A hop continuing a `traceparent` header's value (a new trace when it
    /// is missing or invalid).
    pub fn continuing(
        kind: Kind,
        name: impl Into<Cow<'static, str>>,
        traceparent: Option<&str>,
    ) -> Hop {
        Hop::start(kind, name, traceparent.and_then(TraceParent::parse))
    }

    /// The W3C `tracestate` the caller sent (validated), sent on unchanged.
    pub fn with_tracestate(mut self, state: Option<String>) -> Hop {
        self.state = state;
        self
    }

    /// The `tracestate` to send on with [`Hop::traceparent`].
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The `traceparent` to send on: this hop's span.
    pub fn traceparent(&self) -> TraceParent {
        self.me
    }

    /// Names the span (e.g. by the route, once it is known).
    pub fn rename(&mut self, name: impl Into<Cow<'static, str>>) {
        self.name = name.into();
    }

    /// Adds an attribute (kept only while exporting).
    pub fn attribute(&mut self, key: &'static str, value: impl Into<Value>) {
        if enabled() {
            self.attributes.push(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed, with why.
    pub fn fail(&mut self, why: impl std::fmt::Display) {
        if enabled() {
            self.error = Some(why.to_string());
        }
    }

    /// Ends the hop now (dropping it does the same).
    pub fn end(self) {}

    fn record(&mut self) {
        let Some(tracer) = TRACER.get() else { return };
        let (trace_id, span_id, flags) = self.me.ids();
        let parent = match self.parent {
            Some(p) => {
                let (t, s, f) = p.ids();
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(t),
                    SpanId::from_bytes(s),
                    TraceFlags::new(f),
                    true,
                    self.state
                        .as_deref()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_default(),
                ))
            }
            None => Context::new(),
        };
        let kind = match self.kind {
            Kind::Server => SpanKind::Server,
            Kind::Client => SpanKind::Client,
            Kind::Producer => SpanKind::Producer,
            Kind::Consumer => SpanKind::Consumer,
        };
        let status = match self.error.take() {
            Some(why) => Status::error(why),
            None => Status::Unset,
        };
        let mut span = tracer
            .span_builder(std::mem::take(&mut self.name))
            .with_kind(kind)
            .with_trace_id(TraceId::from_bytes(trace_id))
            .with_span_id(SpanId::from_bytes(span_id))
            .with_start_time(self.start)
            .with_attributes(std::mem::take(&mut self.attributes))
            .with_status(status)
            .start_with_context(tracer, &parent);
        let _ = flags;
        opentelemetry::trace::Span::end(&mut span);
    }
}

impl Drop for Hop {
    fn drop(&mut self) {
        self.record();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_sends_on_its_own_span_in_the_same_trace() {
        let parent = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("valid");
        let hop = Hop::start(Kind::Server, "POST /v1/orders", Some(parent));
        let me = hop.traceparent();
        assert_eq!(me.trace_id(), parent.trace_id());
        assert_ne!(me.ids().1, parent.ids().1, "a span of its own");
        let root = Hop::continuing(Kind::Server, "GET /", Some("garbage"));
        assert_ne!(root.traceparent().trace_id(), parent.trace_id());
    }
}
