//! OpenTelemetry from the `waku` binary: a real OTLP/HTTP receiver (axum,
//! decoding the protobuf bodies with `opentelemetry-proto`) gets the batch
//! spans, call spans and consumer metrics of a `waku demo` run; nothing
//! when the SDK is disabled; and a collector that never answers, or a
//! closed port, does not keep a run from finishing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;

use crate::common::{bank_wasm, text, waku_command};

const EVENTS: u64 = 400;
const TOPIC: &str = "accounts";

/// What the receiver got.
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    /// Bodies that did not decode.
    undecodable: usize,
}

/// An OTLP/HTTP receiver on loopback, on a runtime of its own.
struct Receiver {
    address: SocketAddr,
    received: Arc<Mutex<Received>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .with_state(received.clone());
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { address, received, _runtime: runtime }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }
}

async fn traces(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> Vec<u8> {
    let mut received = received.lock().unwrap();
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => received.traces.push(request),
        Err(_) => received.undecodable += 1,
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

async fn metrics(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> Vec<u8> {
    let mut received = received.lock().unwrap();
    match ExportMetricsServiceRequest::decode(body) {
        Ok(request) => received.metrics.push(request),
        Err(_) => received.undecodable += 1,
    }
    ExportMetricsServiceResponse::default().encode_to_vec()
}

/// `waku demo` of the bank over 2 partitions in `dir`, with no `OTEL_*`
/// variable of this process but `otel`; waits at most two minutes (a run
/// takes seconds) and returns how it exited.
fn demo(dir: &Path, otel: &[(&str, &str)]) -> ExitStatus {
    let events = EVENTS.to_string();
    let module = bank_wasm().to_str().unwrap().to_owned();
    let args = ["demo", "--module", &module, "--events", &events, "--accounts", "20", "--partitions", "2"];
    waku_with(dir, &[&args[..], &["--data", "data"]].concat(), otel)
}

/// `waku args` in `dir` with no `OTEL_*` variable of this process but
/// `otel`; waits at most two minutes (a run takes seconds) and returns how
/// it exited.
fn waku_with(dir: &Path, args: &[&str], otel: &[(&str, &str)]) -> ExitStatus {
    let mut command = waku_command(dir);
    command.args(args);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("OTEL_")) {
        command.env_remove(name);
    }
    command.envs(otel.iter().copied());
    finish_within(command, &dir.join("stderr.txt"), Duration::from_secs(120))
}

/// Runs `command` (its standard error into `stderr`) and asserts it exits
/// 0 within `limit`.
fn finish_within(mut command: Command, stderr: &Path, limit: Duration) -> ExitStatus {
    let file = std::fs::File::create(stderr).unwrap();
    let mut child = command.stdout(Stdio::null()).stderr(file).spawn().expect("waku starts");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let printed = text(&std::fs::read(stderr).unwrap());
            assert!(status.success(), "waku demo failed: {status}\n{printed}");
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("waku demo did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn value(value: &Option<AnyValue>) -> Option<String> {
    match value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(text) => Some(text.clone()),
        any_value::Value::IntValue(number) => Some(number.to_string()),
        any_value::Value::DoubleValue(number) => Some(number.to_string()),
        any_value::Value::BoolValue(flag) => Some(flag.to_string()),
        _ => None,
    }
}

fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes.iter().filter_map(|kv| Some((kv.key.clone(), value(&kv.value)?))).collect()
}

fn number(attributes: &BTreeMap<String, String>, name: &str) -> u64 {
    attributes.get(name).unwrap_or_else(|| panic!("no {name} in {attributes:?}")).parse().unwrap()
}

fn spans(received: &Received) -> Vec<&Span> {
    received
        .traces
        .iter()
        .flat_map(|request| &request.resource_spans)
        .flat_map(|resource| &resource.scope_spans)
        .flat_map(|scope| &scope.spans)
        .collect()
}

#[test]
fn a_run_exports_its_batch_spans_call_spans_and_consumer_metrics() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = receiver.endpoint();
    demo(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_SERVICE_NAME", "waku-under-test")]);
    let received = receiver.received.lock().unwrap();
    assert_eq!(received.undecodable, 0);

    let services: Vec<String> = received
        .traces
        .iter()
        .flat_map(|request| &request.resource_spans)
        .filter_map(|resource| attributes(&resource.resource.as_ref()?.attributes).get("service.name").cloned())
        .collect();
    assert!(!services.is_empty() && services.iter().all(|name| name == "waku-under-test"), "{services:?}");

    let spans = spans(&received);
    let batches: Vec<(&Span, BTreeMap<String, String>)> = spans
        .iter()
        .filter(|span| span.name == format!("process {TOPIC}"))
        .map(|span| (*span, attributes(&span.attributes)))
        .collect();
    assert!(!batches.is_empty(), "no batch span among {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    // Every event once, in batches that cover each partition from offset 0
    // with no gap.
    let mut ranges: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let mut consumed = 0;
    for (span, attributes) in &batches {
        assert_eq!(span.kind, SpanKind::Consumer as i32);
        assert_eq!(attributes["messaging.system"], "waku-embedded");
        assert_eq!(attributes["messaging.operation.name"], "process");
        assert_eq!(attributes["messaging.destination.name"], TOPIC);
        assert_eq!(attributes["messaging.consumer.group.name"], "bank");
        let (first, last) =
            (number(attributes, "waku.batch.first_offset"), number(attributes, "waku.batch.last_offset"));
        let count = number(attributes, "messaging.batch.message_count");
        assert_eq!(count, last - first + 1, "{attributes:?}");
        assert!(number(attributes, "waku.batch.key_count") >= 1);
        assert_eq!(number(attributes, "waku.batch.applied"), count);
        consumed += count;
        let partition = number(attributes, "messaging.destination.partition.id");
        ranges.entry(partition).or_default().push((first, last));
        let phases: Vec<&str> = span.events.iter().map(|event| event.name.as_str()).collect();
        for phase in ["poll", "decode", "plan", "calls", "commit"] {
            assert!(phases.contains(&phase), "no {phase} event in {phases:?}");
        }
    }
    assert_eq!(consumed, EVENTS);
    assert_eq!(ranges.keys().copied().collect::<Vec<_>>(), [0, 1]);
    for ranges in ranges.values_mut() {
        ranges.sort_unstable();
        assert_eq!(ranges[0].0, 0);
        for pair in ranges.windows(2) {
            assert_eq!(pair[1].0, pair[0].1 + 1, "{ranges:?}");
        }
    }

    let calls: Vec<(&Span, BTreeMap<String, String>)> = spans
        .iter()
        .filter(|span| span.name.starts_with("call "))
        .map(|span| (*span, attributes(&span.attributes)))
        .collect();
    assert!(!calls.is_empty(), "no call span");
    for (span, attributes) in &calls {
        assert_eq!(span.name, format!("call {}", attributes["waku.module.name"]));
        assert_eq!(attributes["waku.module.name"], "bank");
        assert!(!attributes["waku.module.version"].is_empty());
        assert!(!attributes["waku.event.type"].is_empty());
        assert!(attributes["waku.key"].len() <= 256 && !attributes["waku.key"].is_empty());
        assert_eq!(attributes["waku.call.outcome"], "ok");
        let parent = batches.iter().find(|(batch, _)| batch.span_id == span.parent_span_id);
        let (batch, _) = parent.expect("a call span's parent is a batch span");
        assert_eq!(batch.trace_id, span.trace_id);
    }

    let metrics: Vec<_> = received
        .metrics
        .iter()
        .flat_map(|request| &request.resource_metrics)
        .flat_map(|resource| &resource.scope_metrics)
        .flat_map(|scope| &scope.metrics)
        .collect();
    // Cumulative: the last export of each series holds the run's total.
    let mut consumed_by_partition = BTreeMap::new();
    let mut durations = 0;
    for metric in &metrics {
        match (metric.name.as_str(), &metric.data) {
            ("messaging.client.consumed.messages", Some(metric::Data::Sum(sum))) => {
                for point in &sum.data_points {
                    let attributes = attributes(&point.attributes);
                    assert_eq!(attributes["messaging.destination.name"], TOPIC);
                    assert_eq!(attributes["messaging.consumer.group.name"], "bank");
                    assert!(!attributes.keys().any(|name| name.starts_with("waku.")), "{attributes:?}");
                    let value = match point.value {
                        Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => n as u64,
                        other => panic!("not an integer count: {other:?}"),
                    };
                    consumed_by_partition.insert(attributes["messaging.destination.partition.id"].clone(), value);
                }
            }
            ("messaging.process.duration", Some(metric::Data::Histogram(histogram))) => {
                assert_eq!(metric.unit, "s");
                durations = histogram.data_points.iter().map(|point| point.count).sum::<u64>().max(durations);
            }
            _ => {}
        }
    }
    assert_eq!(consumed_by_partition.values().sum::<u64>(), EVENTS, "{consumed_by_partition:?}");
    assert_eq!(durations, batches.len() as u64);
}

#[test]
fn nothing_is_sent_when_the_sdk_is_disabled_and_only_metrics_without_traces() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = receiver.endpoint();
    demo(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_SDK_DISABLED", "true")]);
    {
        let received = receiver.received.lock().unwrap();
        assert_eq!((received.traces.len(), received.metrics.len(), received.undecodable), (0, 0, 0));
    }
    let dir = tempfile::tempdir().unwrap();
    demo(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_TRACES_EXPORTER", "none")]);
    let received = receiver.received.lock().unwrap();
    assert_eq!(received.traces.len(), 0);
    assert!(!received.metrics.is_empty());
}

#[test]
fn a_collector_that_never_answers_or_is_not_there_does_not_hold_the_run_up() {
    // Accepts connections and never reads or answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let holder = held.clone();
    std::thread::spawn(move || {
        for connection in silent.incoming().map_while(Result::ok) {
            holder.lock().unwrap().push(connection);
        }
    });
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    for endpoint in [&silent_endpoint, &closed_endpoint] {
        let dir = tempfile::tempdir().unwrap();
        // A short schedule so that exports start while the run consumes.
        demo(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "10")]);
    }
    assert!(!held.lock().unwrap().is_empty(), "the run never tried the silent collector");
}

#[test]
fn call_spans_tell_a_retry_and_a_dead_letter_from_a_success() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let probe = crate::common::probe_wasm().to_string_lossy().into_owned();
    let lines = [
        r#"{"type": "Ledger", "body": {"key": 1, "seq": 1, "amount": 5, "fail": null, "ordering": "relaxed"}}"#,
        r#"{"type": "Ledger", "body": {"key": 2, "seq": 1, "amount": 7, "fail": "unrecoverable", "ordering": "relaxed"}}"#,
        r#"{"type": "Ledger", "body": {"key": 3, "seq": 1, "amount": 1, "fail": "retryable", "ordering": "relaxed"}}"#,
    ];
    std::fs::write(dir.path().join("ledger.jsonl"), lines.join("\n") + "\n").unwrap();
    let publish = ["publish", "--data", "data", "--topic", "ledger", "--partitions", "1", "--module", &probe];
    waku_with(dir.path(), &[&publish[..], &["ledger.jsonl"]].concat(), &[]);
    std::fs::create_dir(dir.path().join("modules")).unwrap();
    std::fs::copy(&probe, dir.path().join("modules/probe.wasm")).unwrap();
    let run = ["run", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--modules", "modules"];
    let flags = ["--until-caught-up", "--max-attempts", "2", "--retry-delays", "0s", "--create-emit-topics", "1"];
    let endpoint = receiver.endpoint();
    waku_with(dir.path(), &[&run[..], &flags[..]].concat(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);

    let received = receiver.received.lock().unwrap();
    let spans = spans(&received);
    let outcome_of = |key: &str| -> Vec<String> {
        spans
            .iter()
            .map(|span| attributes(&span.attributes))
            .filter(|attributes| attributes.get("waku.key").is_some_and(|text| text == key))
            .map(|attributes| attributes["waku.call.outcome"].clone())
            .collect()
    };
    assert_eq!(outcome_of("1"), ["ok"]);
    assert_eq!(outcome_of("2"), ["dead-letter"]);
    assert_eq!(outcome_of("3").first().map(String::as_str), Some("retry"), "{:?}", outcome_of("3"));
    for span in spans.iter().filter(|span| span.name.starts_with("call ")) {
        let attributes = attributes(&span.attributes);
        assert_eq!(attributes["waku.module.name"], "probe");
        assert_eq!(attributes["waku.event.type"], "Ledger");
        let failed = attributes["waku.call.outcome"] != "ok";
        let status = span.status.as_ref().map_or(0, |status| status.code);
        assert_eq!(status == 2, failed, "{attributes:?}: status {status}");
    }
}
