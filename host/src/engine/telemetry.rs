//! OpenTelemetry export: a span per batch, spans for its handler calls, and
//! the messaging consumer metrics, sent over OTLP/HTTP (protobuf) to the
//! collector the standard `OTEL_*` variables name.
//!
//! [`Telemetry::from_env`] builds the providers; the consumer gets a cheap
//! handle (an `Arc`) and opens a [`BatchTrace`] per batch; the host shuts
//! the providers down when it stops ([`Telemetry::shutdown`]).
//!
//! What is exported follows the OpenTelemetry messaging conventions:
//!
//! | what | name | attributes |
//! | --- | --- | --- |
//! | batch span (kind Consumer) | `process <topic>` | `messaging.system`, `messaging.operation.name` (`process`), `messaging.operation.type` (`process`), `messaging.destination.name`, `messaging.destination.partition.id`, `messaging.consumer.group.name` (the projection), `messaging.batch.message_count`, `waku.batch.first_offset`, `waku.batch.last_offset`, `waku.batch.key_count`, `waku.batch.applied`, `waku.batch.calls`, `waku.batch.dead_lettered`, `waku.batch.retried`; one event per phase ([`Phase`]) with `waku.phase.duration` (seconds) |
//! | call span (kind Internal, child of its batch) | `call <module>` | `waku.module.name`, `waku.module.version`, `waku.event.type`, `waku.key` (the key's text form, at most [`KEY_TEXT_BYTES`] bytes), `waku.call.events`, `waku.call.outcome` (`ok`, `retry`, `dead-letter`, `host-fault`) |
//! | counter | `messaging.client.consumed.messages` | the low-cardinality ones: `messaging.system`, `messaging.operation.name`, `messaging.destination.name`, `messaging.destination.partition.id`, `messaging.consumer.group.name` |
//! | histogram (s) | `messaging.process.duration` | the same, and `error.type` for a batch that failed |
//!
//! Rules it keeps:
//! - **Off unless configured.** Nothing is built, started or sent unless
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `_METRICS_ENDPOINT`) is set;
//!   `OTEL_SDK_DISABLED=true` turns it off whatever else is set, and
//!   `OTEL_TRACES_EXPORTER=none` / `OTEL_METRICS_EXPORTER=none` one signal.
//!   Off, the consumer's cost is a branch on an `Option` per batch and per
//!   call: no allocation, no clock read.
//! - **The SDK reads the rest**: endpoints, headers, timeouts
//!   (`OTEL_EXPORTER_OTLP_*`), `OTEL_SERVICE_NAME` and
//!   `OTEL_RESOURCE_ATTRIBUTES` (the service name defaults to `waku`),
//!   `OTEL_TRACES_SAMPLER` / `_ARG`, the batch processor's `OTEL_BSP_*` and
//!   the metric reader's `OTEL_METRIC_EXPORT_INTERVAL`. Only `http/protobuf`
//!   is sent; another `OTEL_EXPORTER_OTLP_PROTOCOL` is refused at start-up,
//!   and so is an endpoint that is no `http(s)://` URL (which the SDK would
//!   replace with its default).
//! - **A collector never holds up the consumer.** Spans go through the
//!   SDK's batch processor (its own thread, a bounded queue, spans dropped
//!   when it is full) and metrics through the periodic reader (its own
//!   thread); the HTTP client runs on those threads. Shutting down waits at
//!   most [`SHUTDOWN_WAIT`].
//! - **Bounded cost per batch.** Call spans are made only for a sampled
//!   batch (the trace's sampler decides for the batch and its calls
//!   together), at most [`CALL_SPANS_PER_BATCH`] of them; metrics carry no
//!   keys or offsets.
//! - Names and keys are the publisher's and the module's text: they go out
//!   as attribute values (bounded), never into span or metric names but the
//!   topic and module name, which the operator chose.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use crate::engine::consumer::{Phase, Summary};
use crate::key::Key;

/// The most call spans one batch makes (the rest of its calls are counted
/// in its span's `waku.batch.calls` only).
pub const CALL_SPANS_PER_BATCH: usize = 64;

/// The most bytes of a key's text form a call span carries.
pub const KEY_TEXT_BYTES: usize = 256;

/// The longest [`Telemetry::shutdown`] waits for the last export.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// The service name when `OTEL_SERVICE_NAME` is not set.
const SERVICE_NAME: &str = "waku";

/// Bucket boundaries of `messaging.process.duration`, in seconds (the
/// conventions' advice for durations).
const DURATION_BOUNDARIES: [f64; 14] =
    [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A protocol other than the one this host speaks.
    #[error(
        "{variable}={value}: this host sends OTLP over HTTP with protobuf bodies only; set it to `http/protobuf` or unset it"
    )]
    Protocol {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// An endpoint that is not an `http://` or `https://` URL (the SDK
    /// would send to its default, `localhost:4318`, instead).
    #[error("{variable}={value:?}: not an http:// or https:// URL")]
    Endpoint {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter refused its configuration (an endpoint that is not a
    /// URL, a compression it cannot do, …).
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Which signals the environment turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Signals {
    traces: bool,
    metrics: bool,
}

impl Signals {
    /// Reads the variables through `var` (the process environment, or a
    /// test's table).
    fn of(var: impl Fn(&str) -> Option<String>) -> Result<Self, TelemetryError> {
        let set = |name: &str| var(name).is_some_and(|value| !value.trim().is_empty());
        let is = |name: &str, wanted: &str| var(name).is_some_and(|value| value.trim().eq_ignore_ascii_case(wanted));
        if is("OTEL_SDK_DISABLED", "true") {
            return Ok(Self::default());
        }
        for variable in
            ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"]
        {
            if let Some(value) = var(variable).filter(|value| value.trim() != "http/protobuf" && !value.is_empty()) {
                return Err(TelemetryError::Protocol { variable, value });
            }
        }
        for variable in
            ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
        {
            let value = var(variable).unwrap_or_default();
            let url = value.trim();
            let authority = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
            if !url.is_empty() && (authority.is_none_or(str::is_empty) || url.parse::<axum::http::Uri>().is_err()) {
                return Err(TelemetryError::Endpoint { variable, value });
            }
        }
        let any = set("OTEL_EXPORTER_OTLP_ENDPOINT");
        Ok(Self {
            traces: (any || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !is("OTEL_TRACES_EXPORTER", "none"),
            metrics: (any || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")) && !is("OTEL_METRICS_EXPORTER", "none"),
        })
    }
}

/// The host's OpenTelemetry providers; cloning shares them. See the
/// [module docs](self).
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    /// `messaging.system`: `iggy`, or the embedded log's `waku-embedded`.
    system: &'static str,
    traces: Option<(SdkTracerProvider, SdkTracer)>,
    metrics: Option<Metrics>,
    /// Where spans and metrics go, as the environment names it, for
    /// messages.
    endpoints: Endpoints,
}

/// Where each signal is sent, as the environment says (a signal's own
/// variable, else the common one, else the SDK's default).
struct Endpoints {
    traces: String,
    metrics: String,
}

impl Endpoints {
    /// The SDK's default base, which it uses when no variable is set.
    const DEFAULT: &'static str = "http://localhost:4318";

    fn of(variable: impl Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| variable(name).filter(|value| !value.trim().is_empty());
        let base = set("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| Self::DEFAULT.to_owned());
        let base = base.trim_end_matches('/');
        Self {
            traces: set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").unwrap_or_else(|| format!("{base}/v1/traces")),
            metrics: set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").unwrap_or_else(|| format!("{base}/v1/metrics")),
        }
    }
}

/// `error` and its causes, `: `-separated, each said once.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = next.source();
    }
    text
}

struct Metrics {
    provider: SdkMeterProvider,
    consumed: Counter<u64>,
    duration: Histogram<f64>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("system", &self.inner.system)
            .field("traces", &self.inner.traces.is_some())
            .field("metrics", &self.inner.metrics.is_some())
            .finish()
    }
}

impl Telemetry {
    /// The providers the process environment asks for, or `None` when it
    /// asks for none (see the [module docs](self)). `system` is the
    /// `messaging.system` of every span and metric.
    ///
    /// Blocks briefly (the HTTP client is built on a thread of its own):
    /// call it from a blocking context.
    pub fn from_env(system: &'static str) -> Result<Option<Self>, TelemetryError> {
        let signals = Signals::of(|name| std::env::var(name).ok())?;
        if signals == Signals::default() {
            return Ok(None);
        }
        let mut resource = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        let resource = resource.build();
        let traces = match signals.traces {
            false => None,
            true => {
                let exporter = SpanExporter::builder().with_http().with_protocol(Protocol::HttpBinary).build()?;
                let provider =
                    SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.clone()).build();
                let tracer = provider.tracer("wakuwaku");
                Some((provider, tracer))
            }
        };
        let metrics = match signals.metrics {
            false => None,
            true => {
                let exporter = MetricExporter::builder().with_http().with_protocol(Protocol::HttpBinary).build()?;
                let provider = SdkMeterProvider::builder()
                    .with_reader(PeriodicReader::builder(exporter).build())
                    .with_resource(resource)
                    .build();
                let meter = provider.meter("wakuwaku");
                let consumed = meter
                    .u64_counter("messaging.client.consumed.messages")
                    .with_unit("{message}")
                    .with_description("Messages a batch consumed and committed.")
                    .build();
                let duration = meter
                    .f64_histogram("messaging.process.duration")
                    .with_unit("s")
                    .with_description("How long a batch took, from its poll to its commit.")
                    .with_boundaries(DURATION_BOUNDARIES.to_vec())
                    .build();
                Some(Metrics { provider, consumed, duration })
            }
        };
        let endpoints = Endpoints::of(|name| std::env::var(name).ok());
        Ok(Some(Self { inner: Arc::new(Inner { system, traces, metrics, endpoints }) }))
    }

    /// Opens the trace of a batch of `count` messages of `topic`'s
    /// `partition`, offsets `first..=last`, for `projection`; it began
    /// `polled` ago (its poll).
    pub fn batch(&self, batch: BatchOf<'_>, polled: Duration) -> BatchTrace {
        let started = Instant::now() - polled;
        let start_time = SystemTime::now() - polled;
        let inner = &self.inner;
        let common = vec![
            KeyValue::new("messaging.system", inner.system),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", batch.topic.to_owned()),
            KeyValue::new("messaging.destination.partition.id", batch.partition.to_string()),
            KeyValue::new("messaging.consumer.group.name", batch.projection.to_owned()),
        ];
        let (span, calls) = match &inner.traces {
            None => (None, CallTrace::none()),
            Some((_, tracer)) => {
                let mut attributes = common.clone();
                attributes.extend([
                    KeyValue::new("messaging.operation.type", "process"),
                    KeyValue::new("messaging.batch.message_count", batch.count as i64),
                    KeyValue::new("waku.batch.first_offset", batch.first as i64),
                    KeyValue::new("waku.batch.last_offset", batch.last as i64),
                ]);
                let span = tracer
                    .span_builder(format!("process {}", batch.topic))
                    .with_kind(SpanKind::Consumer)
                    .with_start_time(start_time)
                    .with_attributes(attributes)
                    .start(tracer);
                let parent = span
                    .span_context()
                    .is_sampled()
                    .then(|| (Context::new().with_remote_span_context(span.span_context().clone()), tracer.clone()));
                (
                    Some(span),
                    CallTrace { parent, left: AtomicUsize::new(CALL_SPANS_PER_BATCH), keys: AtomicUsize::new(0) },
                )
            }
        };
        BatchTrace {
            telemetry: self.clone(),
            span,
            calls: Arc::new(calls),
            common,
            started,
            start_time,
            polled,
            count: batch.count,
        }
    }

    /// Sends what is left and stops the providers, waiting at most
    /// [`SHUTDOWN_WAIT`] (on a thread of its own, so a collector that does
    /// not answer holds nobody up longer). Returns whether it finished in
    /// time.
    pub fn shutdown(&self) -> bool {
        let telemetry = self.clone();
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("waku-otel-shutdown".into()).spawn(move || {
            let inner = &telemetry.inner;
            if let Some((provider, _)) = &inner.traces
                && let Err(error) = provider.shutdown_with_timeout(SHUTDOWN_WAIT)
            {
                tracing::warn!(
                    "OpenTelemetry: the last spans were not sent to {}: {}",
                    inner.endpoints.traces,
                    with_causes(&error)
                );
            }
            if let Some(metrics) = &inner.metrics
                && let Err(error) = metrics.provider.shutdown_with_timeout(SHUTDOWN_WAIT)
            {
                tracing::warn!(
                    "OpenTelemetry: the last metrics were not sent to {}: {}",
                    inner.endpoints.metrics,
                    with_causes(&error)
                );
            }
            let _ = done.send(());
        });
        spawned.is_ok() && finished.recv_timeout(SHUTDOWN_WAIT).is_ok()
    }
}

/// What a batch is, for [`Telemetry::batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchOf<'a> {
    /// The projection (`messaging.consumer.group.name`).
    pub projection: &'a str,
    /// The topic read (the projection's, or its retry topic).
    pub topic: &'a str,
    /// The partition.
    pub partition: u32,
    /// Messages in the batch.
    pub count: usize,
    /// The offset of its first message.
    pub first: u64,
    /// The offset of its last message.
    pub last: u64,
}

/// One batch's span and metrics, open until [`BatchTrace::finish`].
pub struct BatchTrace {
    telemetry: Telemetry,
    span: Option<Span>,
    calls: Arc<CallTrace>,
    /// The metrics' attributes (the span's first ones).
    common: Vec<KeyValue>,
    started: Instant,
    start_time: SystemTime,
    /// How long its poll took (before the batch's own phases).
    polled: Duration,
    count: usize,
}

impl BatchTrace {
    /// What the batch's calls report to.
    pub fn calls(&self) -> Arc<CallTrace> {
        self.calls.clone()
    }

    /// Ends the span with what the batch did (`Err`: it did not commit) and
    /// records the metrics.
    pub fn finish(mut self, outcome: Result<&Summary, &dyn std::fmt::Display>) {
        let elapsed = self.started.elapsed();
        if let Some(span) = &mut self.span {
            match outcome {
                Ok(summary) => {
                    span.set_attributes([
                        KeyValue::new("waku.batch.key_count", self.calls.keys.load(Ordering::Relaxed) as i64),
                        KeyValue::new("waku.batch.applied", summary.applied as i64),
                        KeyValue::new("waku.batch.calls", summary.calls as i64),
                        KeyValue::new("waku.batch.dead_lettered", summary.dead_lettered as i64),
                        KeyValue::new("waku.batch.retried", summary.retry_in as i64),
                    ]);
                    // Phases as events at the times they would end, run one
                    // after another (worker phases are sums: capped at the end).
                    let end = self.start_time + elapsed;
                    let mut at = self.start_time;
                    let mut phases = summary.phases;
                    if phases.get(Phase::Poll).is_zero() {
                        phases.add(Phase::Poll, self.polled);
                    }
                    for (phase, time) in phases.iter() {
                        at = (at + time).min(end);
                        let seconds = KeyValue::new("waku.phase.duration", time.as_secs_f64());
                        span.add_event_with_timestamp(phase.name(), at, vec![seconds]);
                    }
                }
                Err(error) => {
                    span.set_attribute(KeyValue::new("error.type", "batch_not_committed"));
                    span.set_status(Status::error(bounded(&error.to_string(), 1024).to_owned()));
                }
            }
            span.end();
        }
        if let Some(metrics) = &self.telemetry.inner.metrics {
            match outcome {
                Ok(_) => {
                    metrics.consumed.add(self.count as u64, &self.common);
                    metrics.duration.record(elapsed.as_secs_f64(), &self.common);
                }
                Err(_) => {
                    self.common.push(KeyValue::new("error.type", "batch_not_committed"));
                    metrics.duration.record(elapsed.as_secs_f64(), &self.common);
                }
            }
        }
    }
}

/// What the calls of one batch report to, from the worker threads: the
/// batch span to hang their spans on, when it is sampled.
pub struct CallTrace {
    parent: Option<(Context, SdkTracer)>,
    /// Call spans this batch may still make.
    left: AtomicUsize,
    /// The batch's distinct keys.
    keys: AtomicUsize,
}

/// How a handler call ended, as a call span's `waku.call.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It succeeded.
    Ok,
    /// It failed and its events go to the retry topic.
    Retry,
    /// It failed and its events go to the dead-letter topic.
    DeadLetter,
    /// The host failed under it (the batch does not commit).
    HostFault,
}

impl CallOutcome {
    /// The attribute value.
    pub fn name(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Retry => "retry",
            CallOutcome::DeadLetter => "dead-letter",
            CallOutcome::HostFault => "host-fault",
        }
    }
}

/// One handler call, for [`CallTrace::call`].
#[derive(Debug, Clone, Copy)]
pub struct CallOf<'a> {
    /// The module's name.
    pub module: &'a str,
    /// The module's version.
    pub version: &'a str,
    /// The event type.
    pub event_type: &'a str,
    /// The key.
    pub key: &'a Key,
    /// Events the call stood for.
    pub events: u64,
}

impl CallTrace {
    fn none() -> Self {
        Self { parent: None, left: AtomicUsize::new(0), keys: AtomicUsize::new(0) }
    }

    /// Records the batch's count of distinct keys.
    pub fn set_keys(&self, keys: usize) {
        self.keys.store(keys, Ordering::Relaxed);
    }

    /// A span for a call that took `elapsed` (until now) and ended as
    /// `outcome`, if the batch is sampled and has spans left.
    pub fn call(&self, call: CallOf<'_>, elapsed: Duration, outcome: CallOutcome) {
        let Some((parent, tracer)) = &self.parent else { return };
        if self.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1)).is_err() {
            return;
        }
        let end = SystemTime::now();
        let mut key = String::new();
        {
            use std::fmt::Write as _;
            let _ = write!(Bounded { out: &mut key, left: KEY_TEXT_BYTES }, "{}", call.key);
        }
        let mut span = tracer
            .span_builder(format!("call {}", call.module))
            .with_kind(SpanKind::Internal)
            .with_start_time(end - elapsed)
            .with_attributes([
                KeyValue::new("waku.module.name", call.module.to_owned()),
                KeyValue::new("waku.module.version", call.version.to_owned()),
                KeyValue::new("waku.event.type", call.event_type.to_owned()),
                KeyValue::new("waku.key", key),
                KeyValue::new("waku.call.events", call.events as i64),
                KeyValue::new("waku.call.outcome", outcome.name()),
            ])
            .start_with_context(tracer, parent);
        if outcome != CallOutcome::Ok {
            span.set_status(Status::error(outcome.name()));
        }
        span.end_with_timestamp(end);
    }
}

/// Writes at most `left` bytes, cut at a character boundary; the rest is
/// dropped (so a huge key costs no more than its first bytes).
struct Bounded<'a> {
    out: &'a mut String,
    left: usize,
}

impl std::fmt::Write for Bounded<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let taken = bounded(text, self.left);
        self.out.push_str(taken);
        self.left -= taken.len();
        Ok(())
    }
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a
/// character boundary.
fn bounded(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(vars: &[(&str, &str)]) -> Result<Signals, TelemetryError> {
        Signals::of(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
    }

    #[test]
    fn a_warning_names_each_signals_endpoint_and_every_cause_once() {
        let of = |pairs: &'static [(&str, &str)]| {
            Endpoints::of(|name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
        };
        let common = of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]);
        assert_eq!(
            (common.traces.as_str(), common.metrics.as_str()),
            ("http://collector:4318/v1/traces", "http://collector:4318/v1/metrics")
        );
        let own = of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:2/x"),
        ]);
        assert_eq!((own.traces.as_str(), own.metrics.as_str()), ("http://t:2/x", "http://c:1/v1/metrics"));
        assert_eq!(of(&[]).traces, "http://localhost:4318/v1/traces");
        #[derive(Debug, thiserror::Error)]
        #[error("export failed")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        assert_eq!(with_causes(&error), "export failed: connection refused");
    }

    #[test]
    fn nothing_is_on_without_an_endpoint_and_disabled_wins() {
        assert_eq!(signals(&[]).unwrap(), Signals::default());
        assert_eq!(
            signals(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap(),
            Signals::default()
        );
        let both = Signals { traces: true, metrics: true };
        assert_eq!(signals(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]).unwrap(), both);
        let disabled = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_SDK_DISABLED", "TRUE")];
        assert_eq!(signals(&disabled).unwrap(), Signals::default());
        let traces = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")];
        assert_eq!(signals(&traces).unwrap(), Signals { traces: true, metrics: false });
        let no_metrics = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_METRICS_EXPORTER", "none")];
        assert_eq!(signals(&no_metrics).unwrap(), Signals { traces: true, metrics: false });
    }

    #[test]
    fn another_protocol_is_refused_with_the_variable() {
        let grpc = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let error = signals(&grpc).unwrap_err().to_string();
        assert!(error.starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: "), "{error}");
        let fine = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")];
        assert!(signals(&fine).is_ok());
    }

    #[test]
    fn an_endpoint_that_is_no_http_url_is_refused_not_replaced_by_the_default() {
        for bad in ["collector:4318", "http://", "ftp://h", "http://a b"] {
            let error = signals(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", bad)]).unwrap_err().to_string();
            assert!(error.starts_with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="), "{bad}: {error}");
        }
        assert!(signals(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:4318/otlp")]).is_ok());
    }

    #[test]
    fn text_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 5), "abc");
        assert_eq!(bounded("aé", 2), "a");
        let mut out = String::new();
        let mut writer = Bounded { out: &mut out, left: 4 };
        std::fmt::Write::write_str(&mut writer, "ab").unwrap();
        std::fmt::Write::write_str(&mut writer, "cdef").unwrap();
        assert_eq!(out, "abcd");
    }
}
