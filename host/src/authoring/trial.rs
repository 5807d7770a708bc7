//! `waku test`: a built component run on sample events through the real
//! host path, in a throwaway store, and what came of it.
//!
//! Rules it keeps:
//! - **The real path.** Events are published as `waku publish` does (the
//!   module's `key`, `ordering` and, for a timed type, `event-time`
//!   exports write the headers; a bad line is refused with its file and
//!   number and nothing runs), into an embedded log in a temporary
//!   directory, and consumed by a host started as `waku run` starts one
//!   ([`crate::operations::host::Host`]): plan, reduce, `combine`, `handle`, state,
//!   counters, emits, routing. Nothing of it outlives the call.
//! - **Several files are several topics.** Each events file is published
//!   to a topic of its own (one partition each, so co-partitioned), in the
//!   order given, and the host consumes them all as one projection, as
//!   `waku run --topic a --topic b` does: a key's events of timed types
//!   are applied in event-time order across the files (ties: the file's
//!   place in the list, then the line), those of untimed types as they are
//!   read. One file is one topic, as before.
//! - **Failures end at once.** A retryable failure or a trap is
//!   dead-lettered at its first attempt (transient ones are still retried
//!   in place), so the outcome is known when the log is consumed; each is
//!   shown with its class.
//! - **A stable outcome.** [`Outcome::to_json`] holds only what the module
//!   decides (per key: state entries, log lines, failures; the counters;
//!   the emitted messages; the counts), never a time, a path or a module
//!   version, so it can be stored and compared ([`differences`]).
//! - **Log lines are the module's.** They are taken from the host's
//!   `tracing` events of target `waku::guest` while a trial runs (see
//!   [`GuestLogCapture`]); trials in one process at the same time share
//!   them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::authoring::publish::{self, PublishError};
use crate::engine::consumer::Summary;
use crate::engine::routing::RetryPolicy;
use crate::event::EventHeaders;
use crate::operations::dead_letter::{self, DeadLetterError};
use crate::operations::host::{Host, HostError, HostSettings, ModuleSource};
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::{EmbeddedLog, EventLog, LogError};
use crate::storage::state::StateError;

/// The topic the sample events are published to (the first file's, when
/// there are several: `events`, `events-2`, `events-3`, …).
const TOPIC: &str = "events";

/// The topic of the `index`th events file (from 0).
fn topic_of(index: usize) -> String {
    if index == 0 { TOPIC.to_owned() } else { format!("{TOPIC}-{}", index + 1) }
}
/// The projection's name.
const PROJECTION: &str = "test";

/// Why a trial could not run (a module's failures are an [`Outcome`], not
/// an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrialError {
    /// A line of the events file is bad; nothing ran.
    #[error("{}: {error}", file.display())]
    Events {
        /// The file.
        file: PathBuf,
        /// What is wrong, with the line.
        error: PublishError,
    },
    /// The temporary store could not be made.
    #[error("creating the temporary store: {0}")]
    Temp(#[source] std::io::Error),
    /// The embedded log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The host could not start (the module does not fit a projection, its
    /// emit topics could not be made) or stopped with an error.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The dead letters could not be read.
    #[error(transparent)]
    DeadLetters(#[from] DeadLetterError),
}

/// What came of a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Events published.
    pub published: usize,
    /// What the consumer counted.
    pub summary: Summary,
    /// Per key, in the key's text form.
    pub keys: BTreeMap<String, KeyOutcome>,
    /// The shared counters.
    pub counters: BTreeMap<String, i128>,
    /// Messages the module emitted, per topic in log order.
    pub emitted: Vec<Emitted>,
    /// Log lines written outside a handler call (`key`, `ordering`,
    /// `combine`).
    pub log: Vec<String>,
    /// What was not kept past [`MOST_LOG_LINES`] and
    /// [`MOST_EMITTED_BYTES`].
    pub not_kept: NotKept,
    /// The module's event types by tag, so the report names a failed
    /// event's type (the stored JSON keeps the tag alone).
    pub type_names: BTreeMap<u32, String>,
    /// Timers still pending at the end (set, and not passed by the clock
    /// the files' event times give).
    pub timers_pending: u64,
}

/// The most module log lines a trial keeps; later ones are counted.
pub const MOST_LOG_LINES: usize = 10_000;

/// The most bytes of emitted bodies a trial keeps; later messages are
/// counted.
pub const MOST_EMITTED_BYTES: usize = 64 << 20;

/// What a trial counted but did not keep: a module may log and emit up to
/// its per-call limits at every call, which over a large events file is
/// gigabytes (`waku test` held 8 GB for 300 events).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotKept {
    /// Log lines past [`MOST_LOG_LINES`].
    pub log_lines: usize,
    /// Emitted messages past [`MOST_EMITTED_BYTES`] of bodies.
    pub emitted: usize,
}

/// What a trial left for one key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyOutcome {
    /// Its state entries after the run (JSON where they are JSON).
    pub state: BTreeMap<String, Value>,
    /// Its log lines, `<level> <message>`, in order.
    pub log: Vec<String>,
    /// Its failed calls, as dead-lettered.
    pub failures: Vec<Failure>,
}

/// A failed call's dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The class (`unrecoverable`, `retryable`, `trap`, …).
    pub class: String,
    /// The event type's tag.
    pub tag: u32,
    /// Events it stands for.
    pub events: u64,
    /// The module's message.
    pub message: String,
}

/// A message the module emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Emitted {
    /// The topic.
    pub topic: String,
    /// Its key, in text form.
    pub key: String,
    /// Its type tag.
    pub tag: u32,
    /// Its body (JSON where it is JSON).
    pub body: Value,
}

/// Runs `module` on the JSON-lines `events` (read from `file`, named in
/// errors) in a throwaway store.
pub async fn run(module: Arc<dyn HandlerModule>, files: &[(String, PathBuf)]) -> Result<Outcome, TrialError> {
    let temp = tempfile::tempdir().map_err(TrialError::Temp)?;
    let log = Arc::new(EmbeddedLog::open(temp.path().join("log.redb"))?);
    let mut outgoing = Vec::with_capacity(files.len());
    for (events, file) in files {
        let bad_events = |error| TrialError::Events { file: file.to_owned(), error };
        let parsed = publish::parse_json_lines(events, &*module).map_err(bad_events)?;
        outgoing.push((parsed, publish::event_lines(events), file));
    }
    let mut published = 0;
    for (index, (events, lines, file)) in outgoing.into_iter().enumerate() {
        let topic = topic_of(index);
        log.create_topic(&topic, 1).await?;
        published += publish::publish(&*log, &topic, module.clone(), events, Some(lines), 1)
            .await
            .map_err(|error| TrialError::Events { file: file.to_owned(), error })?;
    }

    let mut settings = HostSettings::new(temp.path(), PROJECTION, TOPIC, ModuleSource::Loaded(vec![module.clone()]));
    settings.more_topics = (1..files.len()).map(topic_of).collect();
    settings.create_emit_topics = Some(1);
    settings.until_caught_up = true;
    settings.consumer.retry =
        RetryPolicy { max_attempts: 1, transient_backoff: Duration::from_millis(1), ..RetryPolicy::default() };
    let capture = GuestLogCapture::start();
    let summary = match Host::start_on(log.clone(), settings).await {
        Ok(host) => {
            let projection = host.projection().clone();
            host.finished().await.map(|summary| (summary, projection))
        }
        Err(error) => Err(error),
    };
    let lines = capture.finish();
    let (summary, projection) = summary?;

    let store = projection.store();
    let mut keys: BTreeMap<String, KeyOutcome> = BTreeMap::new();
    for key in store.keys()? {
        let state = store.entries(&key)?.into_iter().map(|(name, value)| (name, body_json(&value))).collect();
        keys.insert(key.to_string(), KeyOutcome { state, ..KeyOutcome::default() });
    }
    let mut outside = Vec::new();
    for line in lines.lines {
        match line.key {
            Some(key) => keys.entry(key).or_default().log.push(line.text),
            None => outside.push(line.text),
        }
    }
    for letter in dead_letter::list(&*log, TOPIC, PROJECTION, store).await? {
        let (key, tag) = match &letter.envelope {
            Ok(envelope) => (envelope.key.to_string(), envelope.tag.get()),
            Err(_) => ("(unreadable headers)".to_owned(), 0),
        };
        let (class, message) =
            letter.routed.failure.map(|f| (f.class.name().to_owned(), f.message)).unwrap_or_default();
        keys.entry(key).or_default().failures.push(Failure { class, tag, events: letter.routed.events, message });
    }
    let mut emitted = Vec::new();
    let mut not_kept = NotKept { log_lines: lines.dropped, emitted: 0 };
    let mut budget = MOST_EMITTED_BYTES;
    for topic in module.emits() {
        not_kept.emitted += read_emitted(&log, topic, &mut emitted, &mut budget).await?;
    }
    let counters = store.counters()?.into_iter().collect();
    let type_names = module.event_types().iter().map(|t| (t.tag.get(), t.name.clone())).collect();
    let timers_pending = store.timer_summary(None)?.pending;
    Ok(Outcome { published, summary, keys, counters, emitted, log: outside, not_kept, type_names, timers_pending })
}

/// The messages of `topic` (one partition) into `emitted` while their
/// bodies fit `budget`; returns how many more there were.
async fn read_emitted(
    log: &EmbeddedLog,
    topic: &str,
    emitted: &mut Vec<Emitted>,
    budget: &mut usize,
) -> Result<usize, LogError> {
    let mut from = 0;
    let mut not_kept = 0;
    loop {
        let records = log.read(topic, 0, from, 1024).await?;
        let Some(last) = records.last() else { return Ok(not_kept) };
        from = last.offset + 1;
        for stored in records {
            let Some(left) = budget.checked_sub(stored.record.body.len()) else {
                not_kept += 1;
                continue;
            };
            *budget = left;
            let (key, tag) = match EventHeaders::parse_stored(&stored.record.headers) {
                Ok(headers) => (headers.key.to_string(), headers.tag.get()),
                Err(error) => (format!("(unreadable headers: {error})"), 0),
            };
            emitted.push(Emitted { topic: topic.to_owned(), key, tag, body: body_json(&stored.record.body) });
        }
    }
}

/// A body or state value as JSON if it is JSON, else `{"bytes": "<hex>"}`.
fn body_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| json!({ "bytes": bytes.iter().map(|b| format!("{b:02x}")).collect::<String>() }))
}

impl Outcome {
    /// The stable JSON form, as stored by `waku test --update`.
    pub fn to_json(&self) -> Value {
        let keys: serde_json::Map<String, Value> = self
            .keys
            .iter()
            .map(|(key, outcome)| {
                let failures: Vec<Value> = outcome
                    .failures
                    .iter()
                    .map(|f| json!({ "class": f.class, "tag": f.tag, "events": f.events, "message": f.message }))
                    .collect();
                (key.clone(), json!({ "state": outcome.state, "log": outcome.log, "failures": failures }))
            })
            .collect();
        let counters: serde_json::Map<String, Value> = self
            .counters
            .iter()
            .map(|(name, value)| {
                let value = i64::try_from(*value).map_or_else(|_| json!(value.to_string()), |v| json!(v));
                (name.clone(), value)
            })
            .collect();
        let emitted: Vec<Value> = self
            .emitted
            .iter()
            .map(|e| json!({ "topic": e.topic, "key": e.key, "tag": e.tag, "body": e.body }))
            .collect();
        let s = &self.summary;
        let mut json = json!({
            "events": {
                "published": self.published,
                "applied": s.applied,
                "skipped": s.skipped,
                "dead_lettered": s.dead_lettered,
            },
            "keys": keys,
            "counters": counters,
            "emitted": emitted,
            "log": self.log,
        });
        if self.not_kept != NotKept::default() {
            json["not_kept"] = json!({ "log_lines": self.not_kept.log_lines, "emitted": self.not_kept.emitted });
        }
        // Only a module that set timers has them in its outcome, so an
        // outcome stored before timers reads the same.
        if self.has_timers() {
            json["timers"] = json!({
                "fired": s.timers_fired,
                "dead_lettered": s.timers_dead_lettered,
                "pending": self.timers_pending,
            });
        }
        json
    }

    /// Whether any timer was fired, dead-lettered or left pending.
    fn has_timers(&self) -> bool {
        self.summary.timers_fired + self.summary.timers_dead_lettered + self.timers_pending > 0
    }

    /// The outcome for people: per key its state, log lines and failures,
    /// then the counters, the emitted messages and the counts. What the
    /// module wrote is shown escaped.
    pub fn report(&self) -> String {
        use wakuwaku_core::terminal::printable;
        let mut out = Vec::new();
        for (key, outcome) in &self.keys {
            out.push(format!("key {}", printable(key)));
            for (name, value) in &outcome.state {
                out.push(format!("  state {} = {}", printable(name), printable(&value.to_string())));
            }
            for line in &outcome.log {
                out.push(format!("  log {}", printable(line)));
            }
            for f in &outcome.failures {
                let event_type = match self.type_names.get(&f.tag) {
                    Some(name) => format!("{} (tag {})", printable(name), f.tag),
                    None => format!("tag {}", f.tag),
                };
                let events = if f.events == 1 { "1 event".to_owned() } else { format!("{} events", f.events) };
                out.push(format!("  failed ({}): {event_type}, {events}: {}", f.class, printable(&f.message)));
            }
        }
        for (name, value) in &self.counters {
            out.push(format!("counter {} = {value}", printable(name)));
        }
        for e in &self.emitted {
            out.push(format!(
                "emitted to {}: key {}, tag {}: {}",
                e.topic,
                printable(&e.key),
                e.tag,
                printable(&e.body.to_string())
            ));
        }
        for line in &self.log {
            out.push(format!("log (outside a key) {}", printable(line)));
        }
        let s = &self.summary;
        out.push(format!(
            "{} events: {} applied, {} skipped, {} dead-lettered",
            self.published, s.applied, s.skipped, s.dead_lettered
        ));
        if self.has_timers() {
            out.push(format!(
                "timers: {} fired, {} dead-lettered, {} pending",
                s.timers_fired, s.timers_dead_lettered, self.timers_pending
            ));
        }
        if self.not_kept != NotKept::default() {
            out.push(format!(
                "not kept: {} log lines past the first {MOST_LOG_LINES}, {} emitted messages past the first {} MiB",
                self.not_kept.log_lines,
                self.not_kept.emitted,
                MOST_EMITTED_BYTES >> 20
            ));
        }
        out.join("\n")
    }
}

/// Where `found` differs from `expected`, one line per difference, each
/// naming its place (`keys."7".state.visits: expected 2, found 3`).
pub fn differences(expected: &Value, found: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_at("", expected, found, &mut lines);
    lines
}

fn diff_at(place: &str, expected: &Value, found: &Value, lines: &mut Vec<String>) {
    let here = |place: &str| if place.is_empty() { "the outcome".to_owned() } else { place.to_owned() };
    match (expected, found) {
        (Value::Object(expected), Value::Object(found)) => {
            for (name, value) in expected {
                let place = format!("{place}{}{}", if place.is_empty() { "" } else { "." }, field(name));
                match found.get(name) {
                    Some(other) => diff_at(&place, value, other, lines),
                    None => lines.push(format!("{place}: expected {value}, found nothing")),
                }
            }
            for (name, value) in found.iter().filter(|(name, _)| !expected.contains_key(*name)) {
                let place = format!("{place}{}{}", if place.is_empty() { "" } else { "." }, field(name));
                lines.push(format!("{place}: expected nothing, found {value}"));
            }
        }
        (Value::Array(expected_items), Value::Array(found_items)) if expected_items.len() == found_items.len() => {
            for (index, (value, other)) in expected_items.iter().zip(found_items).enumerate() {
                diff_at(&format!("{place}[{index}]"), value, other, lines);
            }
        }
        _ if expected != found => lines.push(format!("{}: expected {expected}, found {found}", here(place))),
        _ => {}
    }
}

/// An object's field name in a place: bare when it is a plain word, else
/// quoted (keys such as `"ann"` or `[1,2]`).
fn field(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        name.to_owned()
    } else {
        Value::String(name.to_owned()).to_string()
    }
}

/// One captured log line of a module.
#[derive(Debug, Clone)]
struct CapturedLine {
    key: Option<String>,
    text: String,
}

/// The lines captured while a trial runs; `None` when none runs.
static CAPTURED: Mutex<Option<Captured>> = Mutex::new(None);

/// The first [`MOST_LOG_LINES`] lines, and how many came after.
#[derive(Debug, Default)]
struct Captured {
    lines: Vec<CapturedLine>,
    dropped: usize,
}

/// A `tracing` layer that keeps the module log lines (target
/// `waku::guest`) written while a trial runs. The `waku test` command
/// installs it; without it a trial's outcome has no log lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuestLogCapture;

impl GuestLogCapture {
    /// Starts keeping lines.
    fn start() -> CaptureGuard {
        *CAPTURED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Captured::default());
        CaptureGuard
    }
}

/// Stops keeping lines when dropped.
struct CaptureGuard;

impl CaptureGuard {
    fn finish(self) -> Captured {
        CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default()
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// The target of module log lines (`crate::sandbox::runtime::log`).
pub(crate) const GUEST_LOG_TARGET: &str = "waku::guest";

impl GuestLogCapture {
    /// The layer, filtered to module log lines of every level (its own
    /// filter: other layers' filters do not change what it sees).
    pub fn layer<S>() -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer;
        let targets = tracing_subscriber::filter::Targets::new().with_target(GUEST_LOG_TARGET, tracing::Level::TRACE);
        GuestLogCapture.with_filter(targets)
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for GuestLogCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut captured = CAPTURED.lock().unwrap_or_else(|e| e.into_inner());
        let Some(captured) = captured.as_mut() else { return };
        if captured.lines.len() >= MOST_LOG_LINES {
            captured.dropped += 1;
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = event.metadata().level().as_str().to_ascii_lowercase();
        captured.lines.push(CapturedLine { key: fields.key, text: format!("{level} {}", fields.message) });
    }
}

/// The fields of a module's log line.
#[derive(Default)]
struct Fields {
    key: Option<String>,
    message: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "key" => self.key = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_their_place() {
        let expected = json!({
            "keys": {"7": {"state": {"visits": 2}, "log": ["info a"]}, "\"ann\"": {"state": {}}},
            "counters": {"all": 3},
        });
        assert!(differences(&expected, &expected).is_empty());
        let found = json!({
            "keys": {"7": {"state": {"visits": 3}, "log": ["info a", "info b"]}, "8": {"state": {}}},
            "counters": {"all": 3},
        });
        assert_eq!(
            differences(&expected, &found),
            [
                r#"keys."\"ann\"": expected {"state":{}}, found nothing"#,
                r#"keys.7.log: expected ["info a"], found ["info a","info b"]"#,
                "keys.7.state.visits: expected 2, found 3",
                r#"keys.8: expected nothing, found {"state":{}}"#,
            ]
        );
        assert_eq!(differences(&json!(1), &json!("1")), ["the outcome: expected 1, found \"1\""]);
    }

    #[test]
    fn bodies_are_json_or_hex() {
        assert_eq!(body_json(br#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(body_json(&[0, 255]), json!({"bytes": "00ff"}));
    }
}
