//! The console's JSON views and actions, under `/console/api/`.
//!
//! | route | answer |
//! | --- | --- |
//! | `GET session` | who is signed in: access (`full` or `read`), the CSRF token actions carry |
//! | `GET overview` | [`Overview`]: `/status`'s figures, the log, the state backend, modules, readiness, what each partition's clock waits for, the group's members, each partition's last batch |
//! | `GET late-events` | the most recent late events (key, topic, partition, offset, event time, lateness) and how many were read |
//! | `GET history` | the host's samples of throughput and lag over the last ten minutes ([`super::history`]) |
//! | `GET dead-letters` | a page of dead letters ([`LetterRow`]), filtered: `after=<p>:<o>`, `limit`, `topic`, `class`, `type`, `key`, `version`, `since`/`until` (ms), `state` (`waiting`, `redriven`) |
//! | `GET dead-letter?record=<p>:<o>` | one dead letter with its body decoded ([`Body`]) |
//! | `POST redrive` | re-drives dead letters (JSON `{"records": ["0:3"]}`, `{"key": "42"}`, `{"partitions": [0]}` or `{"all": true}`), with the rules of `waku dlq redrive` |
//! | `GET modules` | the running modules, their event types, kept versions, last reloads, swap history, and each loaded version's calls, failures by class, call times and instance memory against the sandbox's limits ([`crate::sandbox::runtime::usage`]) |
//! | `GET module-log?module=<m>&before=<seq>&limit=<n>` | a page of a module's last log lines, newest first (level, version, key, time, text: [`crate::sandbox::runtime::log::LogBook`]) |
//! | `POST rollback` | swaps a kept version in (JSON `{"module": "bank", "version": "778e4efa"}`, no version: the one before), with the checks of `waku modules rollback` |
//! | `GET topics` | a page of the log's topics (`after`, `limit`) with each partition's first and end offsets |
//! | `GET messages` | a page of a topic's messages (`topic`, `partition`, `from`: an offset or `end`, `limit`), headers as text, bodies decoded |
//!
//! Rules kept here: **every list is a page** (at most [`MAX_ROWS`] rows
//! and, for messages, [`MAX_PAGE_BYTES`] of bodies; a dead-letter search
//! reads at most [`SCAN_BUDGET`] letters and says where to go on), so an
//! answer costs the same with a million letters or messages as with ten.
//! **Everything a module or a publisher wrote** (keys, reasons, type
//! names, headers, bodies) is made printable ([`printable`]) before it is
//! sent: no control, bidi or invisible character reaches the page, which
//! shows it as text besides. Actions run the same operations as the CLI
//! ([`dead_letter::redrive_on`], [`crate::operations::lifecycle::Library::rollback_running`]),
//! so their scope rules and checks are the CLI's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use wakuwaku_core::terminal::printable;

use super::Console;
use super::session::Credential;
use crate::engine::progress::LastBatch;
use crate::engine::routing::retry_topic;
use crate::event::EventHeaders;
use crate::key::Key;
use crate::operations::admin::view::parse_query;
use crate::operations::admin::{LiveStatus, Status, running_status};
use crate::operations::dead_letter::{self, DeadLetter, DeadLetterError, Selection, Shelf};
use crate::sandbox::runtime::usage::VersionFigures;
use crate::storage::log::EventLog;
use crate::storage::state::Member;
use crate::storage::stats::Stat;

/// The most rows a page holds, whatever `limit` asks.
pub const MAX_ROWS: usize = 200;

/// The most dead letters one search reads before it answers with what it
/// found and where to go on.
pub const SCAN_BUDGET: usize = 5_000;

/// A page of messages stops once its bodies hold this many bytes (the
/// first message always comes).
pub const MAX_PAGE_BYTES: usize = 1 << 20;

/// The most bytes of a body an answer shows.
pub const MAX_BODY_SHOWN: usize = 64 << 10;

/// A 4xx or 5xx with a one-line reason (printable).
fn refuse(status: StatusCode, reason: impl std::fmt::Display) -> Response {
    (status, format!("{}\n", printable(&reason.to_string()))).into_response()
}

/// Who is signed in, for the page.
#[derive(Serialize)]
struct SessionView<'a> {
    access: super::session::Access,
    /// The token actions carry in [`super::session::CSRF_HEADER`]; empty
    /// for a bearer-token caller (it needs none).
    csrf: &'a str,
    projection: &'a str,
    protected: bool,
}

pub(super) async fn session<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    Extension(credential): Extension<Credential>,
) -> Response {
    let csrf = match &credential {
        Credential::Session { csrf, .. } => csrf.as_str(),
        Credential::Direct(_) => "",
    };
    Json(SessionView {
        access: credential.access(),
        csrf,
        projection: console.admin.projection.name(),
        protected: console.sessions.protected(),
    })
    .into_response()
}

/// What the overview (and the partitions, event-time and rebuild views)
/// show.
#[derive(Serialize)]
pub struct Overview {
    /// `/status`'s figures.
    pub status: Status,
    /// The log: `embedded` or `iggy`.
    pub log: &'static str,
    /// Where the state lives.
    pub state: String,
    /// The readiness verdict, in words (as `/ready` says it).
    pub ready: String,
    /// Whether the projection is caught up.
    pub caught_up: bool,
    /// Per partition index with release stages: what its clock waits for,
    /// in words.
    pub waits: BTreeMap<u32, String>,
    /// The hosts holding the projection's partitions now, this one first
    /// and marked ([`crate::storage::state::StateBackend::members`]; none
    /// for a store one host uses); names made printable.
    pub members: Vec<Member>,
    /// Each partition's last batch on this host, by partition.
    pub batches: BTreeMap<u32, LastBatch>,
    /// The time of the answer, ms since the epoch.
    pub now_ms: u64,
}

/// The log's kind.
fn log_kind<L: EventLog>(log: &L) -> &'static str {
    let any: &dyn std::any::Any = log;
    match any.downcast_ref::<crate::storage::log::AnyLog>() {
        Some(crate::storage::log::AnyLog::Iggy(_)) => "iggy",
        Some(crate::storage::log::AnyLog::Embedded(_)) => "embedded",
        None if any.is::<crate::storage::log::EmbeddedLog>() => "embedded",
        None => "other",
    }
}

pub(super) async fn overview<L: EventLog>(State(console): State<Arc<Console<L>>>) -> Response {
    let admin = &console.admin;
    let live = LiveStatus {
        progress: Some(admin.progress.clone()),
        timing: admin.timing.clone(),
        rebuild: admin.rebuild.clone(),
    };
    let mut status = match running_status(&*admin.log, &admin.projection, &live).await {
        Ok(status) => status,
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
    };
    status.modules = status.modules.into_iter().map(|(name, version)| (shown(&name), shown(&version))).collect();
    let caught_up = admin.progress.caught_up();
    let ready = if !admin.progress.log_available() {
        "the log is unavailable; reconnecting".to_owned()
    } else if caught_up {
        "ready: caught up with the log".to_owned()
    } else {
        let (done, total) = admin.progress.replayed();
        format!("catching up: {done} of {total} events replayed")
    };
    let waits = status.event_time.iter().map(|timing| (timing.partition, waits_for(timing))).collect();
    // A store that cannot list its members leaves them out: the figures
    // still show.
    let members = admin.projection.store().members().unwrap_or_default();
    let mut members: Vec<Member> =
        members.into_iter().map(|member| Member { name: shown(&member.name), ..member }).collect();
    members.sort_by_key(|member| !member.this_host);
    Json(Overview {
        status,
        log: log_kind(&*admin.log),
        state: shown(admin.projection.store().location()),
        ready,
        caught_up,
        waits,
        members,
        batches: admin.progress.last_batches(),
        now_ms: now_ms(),
    })
    .into_response()
}

/// `GET late-events`: the most recent late events (keys made printable)
/// and their count; none for a projection of one topic.
pub(super) async fn late_events<L: EventLog>(State(console): State<Arc<Console<L>>>) -> Response {
    let mut late = console.admin.timing.as_ref().map(|timing| timing.late_events()).unwrap_or_default();
    for event in &mut late.recent {
        event.key = shown(&event.key);
        event.topic = shown(&event.topic);
    }
    Json(late).into_response()
}

pub(super) async fn history<L: EventLog>(State(console): State<Arc<Console<L>>>) -> Response {
    Json(console.history.view()).into_response()
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What the clock of one partition index waits for, in words: the input
/// that still counts with the earliest clock holds it back.
pub fn waits_for(timing: &crate::engine::consumer::PartitionTiming) -> String {
    let counting: Vec<_> = timing.inputs.iter().filter(|input| !input.idle).collect();
    if counting.is_empty() {
        return "nothing: every input reached the end it read; the clock follows the latest event".to_owned();
    }
    if let Some(silent) = counting.iter().find(|input| input.clock_ms.is_none()) {
        return format!(
            "waits for `{}` partition {} to deliver its first event (it reads from offset {})",
            shown(&silent.topic),
            timing.partition,
            silent.position
        );
    }
    let behind = counting.iter().min_by_key(|input| input.clock_ms).expect("not empty");
    let at = behind.clock_ms.map(|ms| crate::engine::routing::context::rfc3339(ms.max(0) as u64)).unwrap_or_default();
    let paused: Vec<String> =
        timing.inputs.iter().filter(|input| input.paused).map(|input| format!("`{}`", shown(&input.topic))).collect();
    let paused = match paused.is_empty() {
        true => String::new(),
        false => format!("; paused ahead of it: {}", paused.join(", ")),
    };
    format!(
        "waits for `{}` partition {} to read past {at} (it reads from offset {}){paused}",
        shown(&behind.topic),
        timing.partition,
        behind.position
    )
}

/// `text` with every hidden character escaped ([`printable`]).
fn shown(text: &str) -> String {
    printable(text).into_owned()
}

/// One dead letter in a list.
#[derive(Serialize)]
pub struct LetterRow {
    /// `<partition>:<offset>` in the dead-letter topic.
    pub place: String,
    /// The topic its event was read from.
    pub topic: String,
    /// `<partition>:<offset>` where its event was read first.
    pub origin: String,
    /// Events it accounts for.
    pub events: u64,
    /// Attempts made.
    pub attempts: u32,
    /// When it failed (RFC 3339) and in ms since the epoch.
    pub failed_at: String,
    /// The same in ms.
    pub failed_at_ms: u64,
    /// The failure class (`-` for none).
    pub class: String,
    /// The reason.
    pub reason: String,
    /// The module and its version that failed (`` when none did).
    pub module: String,
    /// Its version.
    pub version: String,
    /// The event's key, as `waku dlq list` prints it.
    pub key: String,
    /// The event type's name (else its tag).
    pub event_type: String,
    /// Its body's size.
    pub body_bytes: usize,
    /// `waiting`, `re-driven` or `another host's`.
    pub state: String,
}

impl LetterRow {
    fn of(letter: &DeadLetter, names: &BTreeMap<u32, String>) -> Self {
        let routed = &letter.routed;
        let failure = routed.failure.as_ref();
        let (key, tag_name) = match &letter.envelope {
            Ok(envelope) => {
                let name = names.get(&envelope.tag.get()).cloned().unwrap_or_else(|| format!("tag {}", envelope.tag));
                (envelope.key.to_string(), name)
            }
            Err(error) => (format!("(unreadable headers: {error})"), String::new()),
        };
        let event_type = if routed.event_type.is_empty() { tag_name } else { routed.event_type.clone() };
        Self {
            place: format!("{}:{}", letter.partition, letter.offset),
            topic: shown(&routed.topic),
            origin: format!("{}:{}", routed.origin_partition, routed.origin_offset),
            events: routed.events,
            attempts: routed.attempts,
            failed_at: crate::engine::routing::context::rfc3339(routed.failed_at_ms),
            failed_at_ms: routed.failed_at_ms,
            class: failure.map_or("-", |f| f.class.name()).to_owned(),
            reason: shown(failure.map_or("", |f| f.message.as_str())),
            module: shown(failure.map_or("", |f| f.module.as_str())),
            version: shown(failure.map_or("", |f| f.version.as_str())),
            key: shown(&key),
            event_type: shown(&event_type),
            body_bytes: letter.body_bytes,
            state: match (letter.owned, letter.redriven) {
                (false, _) => "another host's",
                (true, true) => "re-driven",
                (true, false) => "waiting",
            }
            .to_owned(),
        }
    }
}

/// The filters of a dead-letter search.
#[derive(Default)]
struct LetterFilter {
    class: Option<String>,
    event_type: Option<String>,
    key: Option<Key>,
    topic: Option<String>,
    version: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    state: Option<String>,
}

impl LetterFilter {
    /// Whether it passes every letter.
    fn passes_all(&self) -> bool {
        let Self { class, event_type, key, topic, version, since, until, state } = self;
        class.is_none()
            && event_type.is_none()
            && key.is_none()
            && topic.is_none()
            && version.is_none()
            && since.is_none()
            && until.is_none()
            && state.is_none()
    }

    /// Whether `letter` passes, read from the letter itself (a row is made
    /// only for those that do: a search reads thousands).
    fn picks(&self, letter: &DeadLetter, names: &BTreeMap<u32, String>) -> bool {
        let routed = &letter.routed;
        let class = routed.failure.as_ref().map_or("-", |f| f.class.name());
        let type_name = || match &letter.envelope {
            Ok(envelope) => names.get(&envelope.tag.get()).cloned().unwrap_or_else(|| format!("tag {}", envelope.tag)),
            Err(_) => String::new(),
        };
        self.class.as_ref().is_none_or(|wanted| class == wanted)
            && self.event_type.as_ref().is_none_or(|name| routed.event_type == *name || type_name() == *name)
            && self.key.as_ref().is_none_or(|key| letter.envelope.as_ref().is_ok_and(|e| e.key == *key))
            && self.topic.as_ref().is_none_or(|topic| routed.topic == *topic)
            && self
                .version
                .as_ref()
                .is_none_or(|version| routed.failure.as_ref().is_some_and(|f| f.version.starts_with(version.as_str())))
            && self.since.is_none_or(|since| routed.failed_at_ms >= since)
            && self.until.is_none_or(|until| routed.failed_at_ms <= until)
            && self.state.as_ref().is_none_or(|state| match state.as_str() {
                "waiting" => letter.owned && !letter.redriven,
                "redriven" => letter.owned && letter.redriven,
                _ => true,
            })
    }
}

/// A page of a dead-letter search.
#[derive(Serialize)]
pub struct LetterPage {
    /// The letters found.
    pub letters: Vec<LetterRow>,
    /// Where the next page starts (`after`), when there may be more.
    pub next: Option<String>,
    /// Letters read to find them.
    pub scanned: usize,
    /// The projection's counts: dead-lettered (in all), re-driven, applied.
    pub dead_lettered: u64,
    /// Re-driven since.
    pub redriven: u64,
    /// Events applied.
    pub applied: u64,
}

/// `<partition>:<offset>`.
fn place(text: &str) -> Result<(u32, u64), String> {
    let (partition, offset) = text.split_once(':').ok_or_else(|| format!("`{text}` is not <partition>:<offset>"))?;
    Ok((
        partition.parse().map_err(|_| format!("`{partition}` is not a partition number"))?,
        offset.parse().map_err(|_| format!("`{offset}` is not an offset"))?,
    ))
}

/// The page size `limit` asks for (default `default`, at most [`MAX_ROWS`]).
fn limit_of(parameters: &BTreeMap<String, String>, default: usize) -> Result<usize, String> {
    match parameters.get("limit") {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if limit >= 1 => Ok(limit.min(MAX_ROWS)),
            _ => Err(format!("`limit` is a number of rows from 1 to {MAX_ROWS}; `{text}` is not")),
        },
    }
}

/// The dead-letter shelf of the projection's `topic` (default: its first).
fn shelf_of<L>(console: &Console<L>, topic: Option<&String>) -> Result<(String, Shelf), String> {
    let projection = &console.admin.projection;
    let topic = topic.cloned().unwrap_or_else(|| projection.topic().to_owned());
    if !projection.topics().contains(&topic) {
        return Err(format!("projection `{}` does not consume topic `{topic}`", projection.name()));
    }
    let shelf = Shelf::shared(&topic, projection.name());
    Ok((topic, shelf))
}

fn counts<L>(console: &Console<L>) -> (u64, u64, u64) {
    match console.admin.projection.store().stats() {
        Ok(stats) => (stats[Stat::DeadLettered], stats[Stat::Redriven], stats[Stat::Applied]),
        Err(_) => (0, 0, 0),
    }
}

pub(super) async fn dead_letters<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    RawQuery(query): RawQuery,
) -> Response {
    const KNOWN: &[&str] = &["after", "limit", "topic", "class", "type", "key", "version", "since", "until", "state"];
    let parsed =
        parse_query(query.as_deref(), KNOWN, "after, limit, topic, class, type, key, version, since, until, state");
    let parameters = match parsed {
        Ok(parameters) => parameters,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let filter = match letter_filter(&parameters) {
        Ok(filter) => filter,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let (limit, after, (topic, shelf)) = match (
        limit_of(&parameters, 50),
        parameters.get("after").map(|text| place(text)).transpose(),
        shelf_of(&console, parameters.get("topic")),
    ) {
        (Ok(limit), Ok(after), Ok(shelf)) => (limit, after, shelf),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let store = console.admin.projection.store();
    let names = crate::engine::projection::type_names(store);
    let (mut letters, mut scanned, mut after) = (Vec::new(), 0, after);
    // Unfiltered, a page reads only its letters; filtered, a thousand at a time.
    let read = if filter.passes_all() { limit } else { 1_000 };
    let next = loop {
        let page = match dead_letter::list_page_on(&*console.admin.log, &topic, &shelf, store, after, read).await {
            Ok(page) => page,
            Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
        };
        let mut stopped = None;
        for letter in &page.letters {
            scanned += 1;
            if filter.picks(letter, &names) {
                letters.push(LetterRow::of(letter, &names));
            }
            if letters.len() == limit || scanned >= SCAN_BUDGET {
                stopped = Some((letter.partition, letter.offset));
                break;
            }
        }
        match (stopped, page.next) {
            // Stopped at the page's last letter of the topic: nothing follows.
            (Some(at), None) if page.letters.last().is_some_and(|last| (last.partition, last.offset) == at) => {
                break None;
            }
            (Some(at), _) => break Some(at),
            (None, Some(next)) => after = Some(next),
            (None, None) => break None,
        }
    };
    let (dead_lettered, redriven, applied) = counts(&console);
    Json(LetterPage {
        letters,
        next: next.map(|(partition, offset)| format!("{partition}:{offset}")),
        scanned,
        dead_lettered,
        redriven,
        applied,
    })
    .into_response()
}

fn letter_filter(parameters: &BTreeMap<String, String>) -> Result<LetterFilter, String> {
    let text = |name: &str| parameters.get(name).filter(|value| !value.is_empty()).cloned();
    let ms = |name: &str| {
        text(name).map(|value| value.parse::<u64>().map_err(|_| format!("`{name}` is a time in ms; `{value}` is not")))
    };
    let key = match text("key") {
        None => None,
        Some(value) => Some(Key::parse_text(&value).map_err(|error| format!("`{value}`: {error}"))?),
    };
    Ok(LetterFilter {
        class: text("class"),
        event_type: text("type"),
        key,
        topic: text("topic"),
        version: text("version"),
        since: ms("since").transpose()?,
        until: ms("until").transpose()?,
        state: text("state"),
    })
}

/// A body as the page shows it: text (JSON laid out), else hex.
#[derive(Serialize)]
pub struct Body {
    /// Its size.
    pub bytes: usize,
    /// `json`, `text` or `binary`.
    pub kind: &'static str,
    /// Its lines (JSON laid out), each made printable; at most
    /// [`MAX_BODY_SHOWN`] bytes of it.
    pub lines: Vec<String>,
    /// Whether it was cut.
    pub cut: bool,
}

impl Body {
    /// `bytes` decoded for the page.
    pub fn of(bytes: &[u8]) -> Self {
        let cut = bytes.len() > MAX_BODY_SHOWN;
        let shown_bytes = &bytes[..bytes.len().min(MAX_BODY_SHOWN)];
        let (kind, text) = match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(value) if !cut => ("json", serde_json::to_string_pretty(&value).unwrap_or_default()),
            _ => match std::str::from_utf8(shown_bytes) {
                Ok(text) => ("text", text.to_owned()),
                // A cut in a character's middle: what comes before it.
                Err(error) if cut && error.error_len().is_none() => {
                    ("text", String::from_utf8_lossy(&shown_bytes[..error.valid_up_to()]).into_owned())
                }
                Err(_) => {
                    let hex: Vec<String> = shown_bytes
                        .chunks(32)
                        .map(|chunk| chunk.iter().map(|byte| format!("{byte:02x}")).collect::<Vec<_>>().join(" "))
                        .collect();
                    ("binary", hex.join("\n"))
                }
            },
        };
        Self { bytes: bytes.len(), kind, lines: text.split('\n').map(shown).collect(), cut }
    }
}

/// One dead letter in full.
#[derive(Serialize)]
struct LetterDetail {
    #[serde(flatten)]
    row: LetterRow,
    /// The event's ordering and algebra, in words.
    event: String,
    body: Body,
}

pub(super) async fn dead_letter<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let parameters = match parse_query(query.as_deref(), &["record", "topic"], "record and topic") {
        Ok(parameters) => parameters,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let record = match parameters.get("record").map(|text| place(text)) {
        Some(Ok(record)) => record,
        Some(Err(error)) => return refuse(StatusCode::BAD_REQUEST, error),
        None => return refuse(StatusCode::BAD_REQUEST, "say which dead letter: record=<partition>:<offset>"),
    };
    let (topic, shelf) = match shelf_of(&console, parameters.get("topic")) {
        Ok(shelf) => shelf,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let store = console.admin.projection.store();
    let shown_letter = match dead_letter::show_on(&*console.admin.log, &topic, &shelf, store, record.0, record.1).await
    {
        Ok(shown_letter) => shown_letter,
        Err(error @ DeadLetterError::NotFound { .. }) => return refuse(StatusCode::NOT_FOUND, error),
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
    };
    let names = crate::engine::projection::type_names(store);
    let event = match &shown_letter.letter.envelope {
        Ok(envelope) => shown(&format!("{}, {}", envelope.ordering, envelope.algebra)),
        Err(error) => shown(&format!("headers unreadable: {error}")),
    };
    Json(LetterDetail { row: LetterRow::of(&shown_letter.letter, &names), event, body: Body::of(&shown_letter.body) })
        .into_response()
}

/// What `POST redrive` takes: one of its fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    /// These records, as `<partition>:<offset>`.
    #[serde(default)]
    pub records: Vec<String>,
    /// These partitions.
    #[serde(default)]
    pub partitions: Vec<u32>,
    /// This key, in its text form (JSON).
    #[serde(default)]
    pub key: Option<String>,
    /// Every dead letter not re-driven yet.
    #[serde(default)]
    pub all: bool,
    /// The topic whose dead letters (default: the projection's first).
    #[serde(default)]
    pub topic: Option<String>,
}

/// What a re-drive did, for the page.
#[derive(Serialize)]
struct RedriveDone {
    records: u64,
    events: u64,
    already: u64,
    partitions: Vec<u32>,
    left: u64,
    others: Vec<u32>,
    retry_topic: String,
}

/// The most records one `POST redrive` names.
pub const MAX_REDRIVE_RECORDS: usize = 1_000;

pub(super) async fn redrive<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    Json(request): Json<RedriveRequest>,
) -> Response {
    if request.records.len() > MAX_REDRIVE_RECORDS {
        return refuse(StatusCode::BAD_REQUEST, format!("name at most {MAX_REDRIVE_RECORDS} records at once"));
    }
    let records: Result<Vec<_>, _> = request.records.iter().map(|text| place(text)).collect();
    let key = request.key.as_deref().map(|text| Key::parse_text(text).map_err(|error| format!("`{text}`: {error}")));
    let (records, key, (topic, shelf)) = match (records, key.transpose(), shelf_of(&console, request.topic.as_ref())) {
        (Ok(records), Ok(key), Ok(shelf)) => (records, key, shelf),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let selection = Selection { partitions: request.partitions.clone(), records, key };
    let named = selection != Selection::default();
    if request.all == named {
        return refuse(
            StatusCode::BAD_REQUEST,
            "say which dead letters to re-drive: records, partitions, a key, or all (only one of all and the others)",
        );
    }
    let projection = &console.admin.projection;
    let done =
        dead_letter::redrive_on(&*console.admin.log, &topic, projection.name(), &shelf, projection.store(), &selection)
            .await;
    match done {
        Ok(done) => Json(RedriveDone {
            records: done.records,
            events: done.events,
            already: done.already,
            partitions: done.partitions,
            left: done.left,
            others: done.others,
            retry_topic: retry_topic(&topic),
        })
        .into_response(),
        Err(
            error @ (DeadLetterError::NothingOwned { .. }
            | DeadLetterError::NotOwned { .. }
            | DeadLetterError::NotFound { .. }
            | DeadLetterError::CannotRedrive { .. }),
        ) => refuse(StatusCode::CONFLICT, error),
        Err(error) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("re-drive stopped: {error}; the slices it committed stay re-driven, run it again for the rest"),
        ),
    }
}

/// One running module, for the page.
#[derive(Serialize)]
struct ModuleRow {
    name: String,
    version: String,
    /// (tag, name, algebra).
    event_types: Vec<(u32, String, String)>,
    /// Kept versions, newest first (the running one among them).
    kept: Vec<String>,
    /// The last reload of its file: version, and the error if refused.
    reload: Option<(String, Option<String>)>,
    /// Its swap history, newest first: (version, action, ms since the epoch).
    swaps: Vec<(String, String, u64)>,
    /// Each version the sandbox loaded, newest first: calls, failures by
    /// class, call times, memory; none for a native module.
    usage: Vec<VersionFigures>,
}

pub(super) async fn modules<L: EventLog>(State(console): State<Arc<Console<L>>>) -> Response {
    let admin = &console.admin;
    let recorded = admin.library.as_ref().and_then(|library| library.recorded().ok()).unwrap_or_default();
    let reloads = admin.library.as_ref().map(|library| library.reloads()).unwrap_or_default();
    let modules = admin.projection.modules();
    let board = modules.iter().find_map(|module| module.usage_board());
    let rows: Vec<ModuleRow> = modules
        .iter()
        .map(|module| ModuleRow {
            name: shown(module.name()),
            version: shown(module.version()),
            event_types: module
                .event_types()
                .iter()
                .map(|t| (t.tag.get(), shown(&t.name), t.algebra.name().to_owned()))
                .collect(),
            kept: recorded.kept.get(module.name()).into_iter().flatten().map(|v| shown(v)).collect(),
            reload: reloads.get(module.name()).map(|r| (shown(&r.version), r.error.as_deref().map(shown))),
            swaps: recorded
                .swaps
                .iter()
                .rev()
                .filter(|swap| swap.module == module.name())
                .map(|swap| (shown(&swap.version), shown(&swap.action), swap.at_ms))
                .collect(),
            usage: board
                .iter()
                .flat_map(|board| board.module(module.name()))
                .map(|figures| VersionFigures {
                    module: shown(&figures.module),
                    version: shown(&figures.version),
                    ..figures
                })
                .collect(),
        })
        .collect();
    // What the figures are measured against: the limits of one instance
    // and of one call.
    let limits = board.map(|board| {
        serde_json::json!({
            "memory_bytes": board.memory_limit(),
            "call_budget_us": u64::try_from(board.call_budget().as_micros()).unwrap_or(u64::MAX),
        })
    });
    Json(serde_json::json!({ "modules": rows, "can_roll_back": admin.library.is_some(), "limits": limits }))
        .into_response()
}

/// `GET module-log`: a page of a module's kept log lines, newest first,
/// every key and line made printable; 404 for a module the sandbox did not
/// load (a native one).
pub(super) async fn module_log<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let parameters = match parse_query(query.as_deref(), &["module", "before", "limit"], "module, before and limit") {
        Ok(parameters) => parameters,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let Some(module) = parameters.get("module") else {
        return refuse(StatusCode::BAD_REQUEST, "`module` names the module whose log lines to show");
    };
    let before = match parameters.get("before").map(|text| text.parse::<u64>().map_err(|_| text)) {
        None => None,
        Some(Ok(before)) => Some(before),
        Some(Err(text)) => {
            return refuse(StatusCode::BAD_REQUEST, format!("`before` is a line number; `{}` is not", shown(text)));
        }
    };
    let limit = match limit_of(&parameters, 50) {
        Ok(limit) => limit,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, shown(&error)),
    };
    let modules = console.admin.projection.modules();
    let book = modules.iter().find_map(|m| m.usage_board()).and_then(|board| board.log(module));
    let Some(book) = book else {
        return refuse(StatusCode::NOT_FOUND, format!("no log lines are kept for module `{}`", shown(module)));
    };
    let mut page = book.page(before, limit);
    for line in &mut page.lines {
        line.version = shown(&line.version);
        line.key = line.key.as_deref().map(shown);
        line.text = shown(&line.text);
    }
    Json(serde_json::json!({
        "module": shown(module),
        "lines": page.lines,
        "next": page.next,
        "written": page.written,
        "kept_most": crate::sandbox::runtime::log::KEPT_LINES,
        "line_bytes": crate::sandbox::runtime::log::KEPT_LINE_BYTES,
    }))
    .into_response()
}

/// What `POST rollback` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// The module.
    pub module: String,
    /// The version or a prefix of it; none: the kept one before the active.
    #[serde(default)]
    pub version: Option<String>,
}

pub(super) async fn rollback<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    Json(request): Json<RollbackRequest>,
) -> Response {
    let Some(library) = console.admin.library.clone() else {
        return refuse(StatusCode::CONFLICT, "this host keeps no module versions (it runs modules given as files)");
    };
    let projection = console.admin.projection.clone();
    let (module, version) = (request.module.clone(), request.version.clone().filter(|v| !v.is_empty()));
    let done =
        tokio::task::spawn_blocking(move || library.rollback_running(&projection, &module, version.as_deref())).await;
    match done {
        Ok(Ok((from, to))) => {
            Json(serde_json::json!({ "module": shown(&request.module), "from": from, "to": to })).into_response()
        }
        Ok(Err(error)) => {
            let mut words = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                words.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            refuse(StatusCode::CONFLICT, words)
        }
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "the rollback stopped unexpectedly; nothing changed"),
    }
}

/// One topic in a list.
#[derive(Serialize)]
struct TopicRow {
    name: String,
    /// `input`, `retry`, `dead letters` or `other`.
    role: &'static str,
    /// Per partition: (first, end).
    partitions: Vec<(u64, u64)>,
    /// Partitions past the first [`MAX_ROWS`], not shown.
    more_partitions: u32,
}

pub(super) async fn topics<L: EventLog>(State(console): State<Arc<Console<L>>>, RawQuery(query): RawQuery) -> Response {
    let parameters = match parse_query(query.as_deref(), &["after", "limit"], "after and limit") {
        Ok(parameters) => parameters,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let limit = match limit_of(&parameters, 50) {
        Ok(limit) => limit,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let log = &*console.admin.log;
    let mut all = match log.topics().await {
        Ok(all) => all,
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
    };
    all.sort();
    let inputs = console.admin.projection.topics();
    let after = parameters.get("after");
    let mut rows = Vec::new();
    let mut next = None;
    for (name, partitions) in all.into_iter().filter(|(name, _)| after.is_none_or(|after| name > after)) {
        if rows.len() == limit {
            next = rows.last().map(|row: &TopicRow| row.name.clone());
            break;
        }
        let role = if inputs.contains(&name) {
            "input"
        } else if inputs.iter().any(|topic| retry_topic(topic) == name) {
            "retry"
        } else if inputs.iter().any(|topic| crate::engine::routing::dlq_topic(topic) == name) {
            "dead letters"
        } else {
            "other"
        };
        let mut extents = Vec::new();
        for partition in 0..partitions.min(MAX_ROWS as u32) {
            match log.extent(&name, partition).await {
                Ok(extent) => extents.push(extent),
                Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
            }
        }
        let more_partitions = partitions.saturating_sub(MAX_ROWS as u32);
        rows.push(TopicRow { name, role, partitions: extents, more_partitions });
    }
    // Names are what publishers chose: printable once the order is settled.
    let next = next.map(|name| name.to_owned());
    for row in &mut rows {
        row.name = shown(&row.name);
    }
    Json(serde_json::json!({ "topics": rows, "next": next })).into_response()
}

/// One message in a page.
#[derive(Serialize)]
struct MessageRow {
    offset: u64,
    /// When the log appended it (RFC 3339), where the log says.
    appended: Option<String>,
    /// Every header as (name, value as text, or hex).
    headers: Vec<(String, String)>,
    /// The waku envelope, when it has one: key, type, ordering, event time.
    event: Option<String>,
    body: Body,
}

pub(super) async fn messages<L: EventLog>(
    State(console): State<Arc<Console<L>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let known = &["topic", "partition", "from", "limit"];
    let parameters = match parse_query(query.as_deref(), known, "topic, partition, from and limit") {
        Ok(parameters) => parameters,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let Some(topic) = parameters.get("topic") else {
        return refuse(StatusCode::BAD_REQUEST, "say which topic: topic=<name>");
    };
    let partition = match parameters.get("partition").map_or(Ok(0), |text| text.parse::<u32>()) {
        Ok(partition) => partition,
        Err(_) => return refuse(StatusCode::BAD_REQUEST, "`partition` is a partition number"),
    };
    let limit = match limit_of(&parameters, 20) {
        Ok(limit) => limit,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let log = &*console.admin.log;
    match log.partitions(topic).await {
        Ok(count) if partition < count => {}
        Ok(count) => {
            return refuse(
                StatusCode::NOT_FOUND,
                format!("topic `{topic}` has {count} partitions; {partition} is none"),
            );
        }
        Err(_) => return refuse(StatusCode::NOT_FOUND, format!("no topic `{topic}` in the log")),
    }
    let (first, end) = match log.extent(topic, partition).await {
        Ok(extent) => extent,
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
    };
    let from = match parameters.get("from").map(String::as_str) {
        None | Some("end") => end.saturating_sub(limit as u64).max(first),
        Some(text) => match text.parse::<u64>() {
            Ok(offset) => offset.max(first),
            Err(_) => return refuse(StatusCode::BAD_REQUEST, "`from` is an offset or `end`"),
        },
    };
    let records = match log.read(topic, partition, from, limit).await {
        Ok(records) => records,
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error),
    };
    let names = crate::engine::projection::type_names(console.admin.projection.store());
    let (mut rows, mut bytes) = (Vec::new(), 0);
    for stored in records {
        if !rows.is_empty() && bytes >= MAX_PAGE_BYTES {
            break;
        }
        bytes += stored.record.body.len();
        rows.push(message_row(stored, &names));
    }
    let next = rows.last().map(|row| row.offset + 1).filter(|next| *next < end);
    let body = serde_json::json!({
        "topic": shown(topic), "partition": partition, "first": first, "end": end, "from": from,
        "next": next, "messages": rows,
    });
    Json(body).into_response()
}

fn message_row(stored: crate::storage::log::StoredRecord, names: &BTreeMap<u32, String>) -> MessageRow {
    let headers = &stored.record.headers;
    let event = EventHeaders::parse_stored(headers).ok().map(|envelope| {
        let name = names.get(&envelope.tag.get()).cloned().unwrap_or_else(|| format!("tag {}", envelope.tag));
        let time = envelope
            .event_time
            .map(|ms| format!(", event time {}", crate::engine::routing::context::rfc3339(ms.max(0) as u64)))
            .unwrap_or_default();
        shown(&format!("key {}, type {name}, {}, {}{time}", envelope.key, envelope.ordering, envelope.algebra))
    });
    MessageRow {
        offset: stored.offset,
        appended: stored.append_time.map(|ms| crate::engine::routing::context::rfc3339(ms.max(0) as u64)),
        headers: headers.iter().map(|header| (shown(&header.name), header_text(&header.value))).collect(),
        event,
        body: Body::of(&stored.record.body),
    }
}

/// A header's value as text: printable UTF-8, else hex.
fn header_text(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.chars().any(|c| c.is_control()) => shown(text),
        _ => format!("0x{}", value.iter().map(|byte| format!("{byte:02x}")).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_laid_out_made_printable_and_cut() {
        let body = Body::of(br#"{"a":"<script>alert(1)</script>","b":"\u202e\u0007"}"#);
        assert_eq!(body.kind, "json");
        let text = body.lines.join("\n");
        assert!(text.contains("<script>alert(1)</script>"), "markup stays text: {text}");
        assert!(!text.contains('\u{202e}') && !text.contains('\u{7}'), "{text:?}");
        assert!(text.contains("\\u{202e}"), "{text}");
        let binary = Body::of(&[0xff, 0x00, 0x10]);
        assert_eq!((binary.kind, binary.lines.as_slice()), ("binary", &["ff 00 10".to_owned()][..]));
        let large = Body::of(&vec![b'x'; MAX_BODY_SHOWN + 10]);
        assert!(large.cut && large.lines[0].len() == MAX_BODY_SHOWN && large.bytes == MAX_BODY_SHOWN + 10);
        assert_eq!(header_text(b"\x1b[2J"), "0x1b5b324a");
        assert_eq!(header_text("a\u{2066}b".as_bytes()), "a\\u{2066}b");
    }

    #[test]
    fn the_clock_waits_for_the_input_behind_in_words() {
        use crate::engine::consumer::{InputTiming, PartitionTiming};
        let input = |topic: &str, position, clock_ms, idle| InputTiming {
            topic: topic.to_owned(),
            position,
            clock_ms,
            idle,
            paused: false,
            replaying: false,
        };
        let mut timing = PartitionTiming {
            partition: 2,
            clock_ms: Some(1_000),
            watermark_lag_ms: None,
            held_events: 0,
            held_bytes: 0,
            order_violations: 0,
            peak_held_bytes: 0,
            inputs: vec![input("orders", 10, Some(5_000), false), input("shipments", 4_120, Some(1_000), false)],
        };
        let words = waits_for(&timing);
        assert!(words.starts_with("waits for `shipments` partition 2 to read past 1970-01-01T00:00:01"), "{words}");
        assert!(words.contains("offset 4120"), "{words}");
        timing.inputs[1].idle = true;
        assert!(waits_for(&timing).starts_with("waits for `orders` partition 2"), "{}", waits_for(&timing));
        timing.inputs[0].clock_ms = None;
        assert!(waits_for(&timing).contains("first event"), "{}", waits_for(&timing));
        timing.inputs[0].idle = true;
        assert!(waits_for(&timing).starts_with("nothing"), "{}", waits_for(&timing));
    }
}
