//! The rules and limits of the module boundary: what a module may hand the
//! host through the contract's imports, what its exports may return, and
//! how much one call and one batch may make the host hold.
//!
//! The host's key scopes and WASM runtime apply these, and so does the guest
//! SDK's test host, so a module's native unit tests meet the same rules,
//! with the same messages, as the module in production.
//!
//! Rules kept here:
//! - **Every refusal names its rule.** A [`Refusal`] (a value an import
//!   refused) and a [`ContractError`] (a return value the host cannot use)
//!   display as `<rule>: <what is wrong>`, where `<rule>` is a stable id
//!   (`state-value-size`, `emit-topic`, …) also given in `wit/handler-0.5.wit`.
//!   Tests and operators can match on it.
//! - **A refused value leaves nothing behind.** [`CallTally`] counts a
//!   value against the per-call limits only when it is accepted.
//! - **Per call, then per batch.** [`PayloadLimits`] bounds each value, each
//!   call's totals (counts and bytes of state writes, counter changes,
//!   emits, log lines) and what one batch may hold in all
//!   ([`PayloadLimits::max_batch_held`]); the host checks the last one when
//!   a call ends, charging what the call's key grew to hold in the batch,
//!   which is at most what [`CallTally::held`] says the call handed over.
//! - **Counters stay in the s64 range as each key sees them**: a change is
//!   refused when the value the key would read afterwards (committed value,
//!   plus its own pending changes, plus the delta) leaves `i64`.
//! - **What a module keeps is bounded too**, not only what it hands over
//!   per call: a projection holds at most
//!   [`PayloadLimits::max_counters`] counters and a key at most
//!   [`PayloadLimits::max_entries_per_key`] entries (`counter-count`,
//!   `entries-per-key`). Only a change that would make a new counter or
//!   entry is refused; changing, overwriting or deleting what exists always
//!   passes. The host counts what is committed plus what the batches in
//!   flight add ([`check_counter_count`], [`check_entries_per_key`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::key::{Key, KeyError};

/// The WIT package and version of the contract, e.g.
/// `wakuwaku:handler@0.5.0`, read from `wit/handler-0.5.wit`: the same file
/// the host's and the SDK's bindings are generated from, so the version is
/// written down once.
pub const CONTRACT: &str = package_of(include_str!("../../wit/handler-0.5.wit"));

/// The version of the contract before timers, `wakuwaku:handler@0.4.0`,
/// read from `wit/handler-0.4.wit` (kept as it was): the host still loads
/// modules built for it, and never calls `fire` on them.
pub const CONTRACT_0_4: &str = package_of(include_str!("../../wit/handler-0.4.wit"));

/// The version of the contract before `timed-relaxed`,
/// `wakuwaku:handler@0.3.0`, read from `wit/handler-0.3.wit` (kept as it
/// was): the host still loads modules built for it, whose `timed` types
/// are [`crate::event::EventTiming::Timed`].
pub const CONTRACT_0_3: &str = package_of(include_str!("../../wit/handler-0.3.wit"));

/// The previous version of the contract, `wakuwaku:handler@0.2.0`, read
/// from `wit/handler.wit` (kept as it was): the host still loads modules
/// built for it, whose event types are all untimed.
pub const CONTRACT_0_2: &str = package_of(include_str!("../../wit/handler.wit"));

/// The longest state entry or counter name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The most event types one module may declare.
pub const MAX_EVENT_TYPES: usize = 256;
/// The tag no module may declare (`event-type-tag-reserved`): the host
/// gives it to the dead letters of timers whose `fire` call failed, so a
/// re-driven letter never reaches a handler as an event.
pub const RESERVED_TAG: u32 = u32::MAX;
/// The longest event type name, in bytes.
pub const MAX_EVENT_TYPE_NAME_BYTES: usize = 128;
/// The most topics one module may declare it emits to.
pub const MAX_EMIT_TOPICS: usize = 64;
/// The longest topic name, in bytes.
pub const MAX_TOPIC_NAME_BYTES: usize = 255;
/// The longest handler-error message kept, in bytes; longer ones are cut
/// (they end up in dead-letter headers).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 << 10;
/// What the host counts against the batch budget for each state write or
/// counter change besides its name and value: the bookkeeping it keeps per
/// entry.
pub const WRITE_OVERHEAD: usize = 64;
/// The longest timer name, in bytes (`timer-name`).
pub const MAX_TIMER_NAME_BYTES: usize = 128;
/// What the host counts against the batch budget for each emitted message
/// besides its topic, key and body: the headers and bookkeeping it keeps.
pub const EMIT_OVERHEAD: usize = 512;

/// The package declared by the `package …;` line of WIT text.
const fn package_of(wit: &'static str) -> &'static str {
    let bytes = wit.as_bytes();
    let marker = b"\npackage ";
    let mut at = 0;
    while at + marker.len() <= bytes.len() {
        let mut matched = 0;
        while matched < marker.len() && bytes[at + matched] == marker[matched] {
            matched += 1;
        }
        if matched == marker.len() {
            let start = at + marker.len();
            let mut end = start;
            while end < bytes.len() && bytes[end] != b';' {
                end += 1;
            }
            let (_, rest) = bytes.split_at(start);
            let (package, _) = rest.split_at(end - start);
            return match std::str::from_utf8(package) {
                Ok(package) => package,
                Err(_) => panic!("the package line of a WIT file is not UTF-8"),
            };
        }
        at += 1;
    }
    panic!("a WIT file declares no package")
}

/// Whether `text` is 1 to `max` bytes of ASCII letters, digits, `_`, `-`,
/// `.` and `:` (an event type name's characters).
const fn is_event_type_text(text: &str, max: usize) -> bool {
    let bytes = text.as_bytes();
    if bytes.is_empty() || bytes.len() > max {
        return false;
    }
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if !(byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || byte == b'.' || byte == b':') {
            return false;
        }
        at += 1;
    }
    true
}

/// Whether `topic` is a valid topic name: 1 to 255 bytes of ASCII letters,
/// digits, `_`, `-` and `.` ([`crate::names::check_topic_name`], the one
/// place the rule is kept).
pub const fn is_topic_name(topic: &str) -> bool {
    crate::names::check_topic_name(topic).is_ok()
}

/// Whether `topic` is one of the host's own topics (`retry_*`, `dlq_*`),
/// which modules may never write to.
pub const fn is_host_topic(topic: &str) -> bool {
    const fn starts_with(bytes: &[u8], prefix: &[u8]) -> bool {
        if bytes.len() < prefix.len() {
            return false;
        }
        let mut at = 0;
        while at < prefix.len() {
            if bytes[at] != prefix[at] {
                return false;
            }
            at += 1;
        }
        true
    }
    starts_with(topic.as_bytes(), b"retry_") || starts_with(topic.as_bytes(), b"dlq_")
}

/// Whether `name` is a valid event type name: 1 to 128 bytes of ASCII
/// letters, digits, `_`, `-`, `.` and `:`.
pub const fn is_event_type_name(name: &str) -> bool {
    is_event_type_text(name, MAX_EVENT_TYPE_NAME_BYTES)
}

/// `text` cut to at most `max` bytes at a character boundary, and whether
/// it was cut.
pub fn cut(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// What [`PayloadLimits::most_lifted_per_call`] allows beyond the largest
/// value: names, a topic, and a `describe` answer (256 event types and 64
/// topics, with wasmtime's own accounting of each record).
pub const LIFT_ROOM: usize = 256 << 10;

/// A handler-error message as the host keeps it: at most
/// [`MAX_ERROR_MESSAGE_BYTES`], marked when cut.
pub fn error_message(message: String) -> String {
    match cut(&message, MAX_ERROR_MESSAGE_BYTES) {
        (_, false) => message,
        (kept, true) => format!("{kept} […cut]"),
    }
}

/// A name, topic or similar taken from a module, short enough to quote in
/// a message.
fn quoted(text: &str) -> String {
    match cut(text, 64) {
        (text, false) => text.to_owned(),
        (text, true) => format!("{text}…"),
    }
}

/// How much a module may hand the host: per value, per `handle` call, and
/// per batch; and how much state it may keep: counters per projection,
/// entries per key. All have defaults (see each field); together they keep
/// one call under about 9 MiB and one batch under 64 MiB of what the host
/// holds for modules.
///
/// Counts and bytes per call count every accepted call of the import, also
/// when it writes the same entry again; refused calls count nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PayloadLimits {
    /// Largest state value a handler may set, in bytes. Default 1 MiB.
    pub max_state_value: usize,
    /// Most state writes (`set` and `delete`) in one call. Default 1 000.
    pub max_state_writes_per_call: usize,
    /// Most bytes of entry names and values written in one call. Default
    /// 4 MiB.
    pub max_state_bytes_per_call: usize,
    /// Most counter changes (`counter-add`) in one call. Default 1 000.
    pub max_counter_changes_per_call: usize,
    /// Largest body a handler may emit, or `combine` may return, in bytes.
    /// Default 1 MiB.
    pub max_emit_body: usize,
    /// Most messages emitted in one call. Default 1 000.
    pub max_emits_per_call: usize,
    /// Most bytes of topics, keys and bodies emitted in one call. Default
    /// 4 MiB.
    pub max_emit_bytes_per_call: usize,
    /// Longest log line kept, in bytes; longer ones are cut and marked.
    /// Default 4 KiB.
    pub max_log_line: usize,
    /// Most log lines kept per call; later ones are dropped and counted in
    /// one closing line. Default 100.
    pub max_log_lines_per_call: usize,
    /// Most bytes the host holds for the state writes, counter changes and
    /// emits of the batches in flight (one per partition, every key's, with
    /// [`WRITE_OVERHEAD`] and [`EMIT_OVERHEAD`] each). A call that would
    /// take them past it fails as retryable, decided by the host: its key
    /// is tried again in a later batch (without losing an attempt unless the
    /// key itself holds over a quarter of the budget). At least what one call may hold
    /// ([`most_held_by_one_call`](Self::most_held_by_one_call)). Default
    /// 64 MiB.
    pub max_batch_held: usize,
    /// Most distinct counters a projection may hold, committed plus those
    /// the batches in flight add (`counter-count`): adding to a counter
    /// that does not exist yet is refused at it, changing an existing one
    /// never is. Counters are shared by every key and every view of the
    /// state lists them, so their number is what this bounds. Default
    /// 10 000.
    pub max_counters: usize,
    /// Most entries one key may hold, committed plus this batch's writes
    /// (`entries-per-key`): setting a new entry past it is refused,
    /// overwriting or deleting one never is. Default 1 000.
    pub max_entries_per_key: usize,
    /// Largest payload of a timer, in bytes (`timer-payload-size`).
    /// Default 1 KiB.
    pub max_timer_payload: usize,
    /// Most timers one key may hold, committed plus this batch's
    /// (`timers-per-key`): setting a new one past it is refused, moving or
    /// cancelling one never is. Default 100.
    pub max_timers_per_key: usize,
    /// Most timers a projection may hold, committed plus those the
    /// batches in flight add (`timers-in-all`). Default 1 000 000.
    pub max_timers: usize,
}

impl Default for PayloadLimits {
    fn default() -> Self {
        Self {
            max_state_value: 1 << 20,
            max_state_writes_per_call: 1_000,
            max_state_bytes_per_call: 4 << 20,
            max_counter_changes_per_call: 1_000,
            max_emit_body: 1 << 20,
            max_emits_per_call: 1_000,
            max_emit_bytes_per_call: 4 << 20,
            max_log_line: 4 << 10,
            max_log_lines_per_call: 100,
            max_batch_held: 64 << 20,
            max_counters: 10_000,
            max_entries_per_key: 1_000,
            max_timer_payload: 1 << 10,
            max_timers_per_key: 100,
            max_timers: 1_000_000,
        }
    }
}

/// Why a set of [`PayloadLimits`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// A limit is zero.
    #[error("limit `{0}` must be at least 1")]
    Zero(&'static str),
    /// The batch budget is smaller than one call may hold, so such a call
    /// could never succeed.
    #[error(
        "the batch budget of {batch} bytes is smaller than one call may hold ({call} bytes with the per-call limits)"
    )]
    BatchBelowCall {
        /// The batch budget.
        batch: usize,
        /// The most one call may hold.
        call: usize,
    },
}

impl PayloadLimits {
    /// The most bytes one call may make the host hold under the per-call
    /// limits, counted as [`max_batch_held`](Self::max_batch_held) counts.
    pub fn most_held_by_one_call(&self) -> usize {
        let writes = self.max_state_bytes_per_call + self.max_state_writes_per_call.saturating_mul(WRITE_OVERHEAD);
        let counters = self.max_counter_changes_per_call.saturating_mul(MAX_NAME_BYTES + WRITE_OVERHEAD);
        let emits = self.max_emit_bytes_per_call + self.max_emits_per_call.saturating_mul(EMIT_OVERHEAD);
        writes.saturating_add(counters).saturating_add(emits)
    }

    /// The most bytes one import call (or one export's answer) may make
    /// the host copy out of an instance before any rule can check them:
    /// the largest value a rule lets through (a state value, an emitted
    /// body, a log line), a key, and [`LIFT_ROOM`] for names, topics and a
    /// `describe` answer. The sandbox gives wasmtime this bound
    /// (`Store::set_hostcall_fuel`, 128 MiB by default), so an argument
    /// past it traps its call (`import-size`) before it is copied.
    pub fn most_lifted_per_call(&self) -> usize {
        let largest = self.max_state_value.max(self.max_emit_body).max(self.max_log_line).max(self.max_timer_payload);
        largest.saturating_add(crate::key::MAX_KEY_BYTES).saturating_add(LIFT_ROOM)
    }

    /// Checks that every limit is at least 1 and that the batch budget
    /// holds at least one call.
    pub fn check(&self) -> Result<(), LimitsError> {
        let fields = [
            ("max_state_value", self.max_state_value),
            ("max_state_writes_per_call", self.max_state_writes_per_call),
            ("max_state_bytes_per_call", self.max_state_bytes_per_call),
            ("max_counter_changes_per_call", self.max_counter_changes_per_call),
            ("max_emit_body", self.max_emit_body),
            ("max_emits_per_call", self.max_emits_per_call),
            ("max_emit_bytes_per_call", self.max_emit_bytes_per_call),
            ("max_log_line", self.max_log_line),
            ("max_log_lines_per_call", self.max_log_lines_per_call),
            ("max_batch_held", self.max_batch_held),
            ("max_counters", self.max_counters),
            ("max_entries_per_key", self.max_entries_per_key),
            ("max_timer_payload", self.max_timer_payload),
            ("max_timers_per_key", self.max_timers_per_key),
            ("max_timers", self.max_timers),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, value)| *value == 0) {
            return Err(LimitsError::Zero(name));
        }
        let call = self.most_held_by_one_call();
        if self.max_batch_held < call {
            return Err(LimitsError::BatchBelowCall { batch: self.max_batch_held, call });
        }
        Ok(())
    }
}

/// A value an import refused, naming the rule it broke. The module sees the
/// message (WIT `refusal`); nothing of the value is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// `state`, `emit` or `timers` called outside `handle` and `fire`.
    #[error("outside-handle: `{interface}` is only available while `handle` or `fire` runs")]
    OutsideHandle {
        /// The interface called.
        interface: &'static str,
    },
    /// An entry or counter name of the wrong length.
    #[error("name-length: an entry or counter name is 1 to {MAX_NAME_BYTES} bytes; this one has {length}")]
    NameLength {
        /// Its length.
        length: usize,
    },
    /// An entry or counter name holding a NUL character, which some state
    /// stores (PostgreSQL `text`) cannot hold.
    #[error("name-nul: an entry or counter name holds no NUL character (U+0000); this one has one at byte {at}")]
    NameNul {
        /// The byte offset of the first NUL.
        at: usize,
    },
    /// A state value over [`PayloadLimits::max_state_value`].
    #[error("state-value-size: state value `{name}` has {length} bytes, over the limit of {limit} bytes")]
    StateValueSize {
        /// The entry.
        name: String,
        /// The value's length.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Past [`PayloadLimits::max_state_writes_per_call`].
    #[error("state-writes-per-call: one call may write (set or delete) at most {limit} entries")]
    StateWritesPerCall {
        /// The limit.
        limit: usize,
    },
    /// Past [`PayloadLimits::max_state_bytes_per_call`].
    #[error(
        "state-bytes-per-call: one call may write at most {limit} bytes of names and values; this write would make \
         {would}"
    )]
    StateBytesPerCall {
        /// The limit.
        limit: usize,
        /// The call's total with this write.
        would: usize,
    },
    /// Past [`PayloadLimits::max_counter_changes_per_call`].
    #[error("counter-changes-per-call: one call may change counters at most {limit} times")]
    CounterChangesPerCall {
        /// The limit.
        limit: usize,
    },
    /// A counter change that would leave the s64 range.
    #[error("counter-range: counter `{name}` is {value} as this key sees it; adding {delta} leaves the s64 range")]
    CounterOverflow {
        /// The counter.
        name: String,
        /// Its value as the key sees it (committed plus its own changes).
        value: i128,
        /// The refused delta.
        delta: i64,
    },
    /// A counter read whose value is outside the s64 range (several keys'
    /// changes committed together took it there).
    #[error("counter-range: counter `{name}` is {value}, outside the s64 range")]
    CounterOutOfRange {
        /// The counter.
        name: String,
        /// Its value as the key sees it.
        value: i128,
    },
    /// A change that would make a new counter while the projection holds
    /// [`PayloadLimits::max_counters`] ([`check_counter_count`]).
    #[error(
        "counter-count: the projection holds {held} counters (committed and pending), at most {limit}; counter \
         `{name}` would be a new one"
    )]
    CounterCount {
        /// The counter.
        name: String,
        /// The counters the projection holds as the host counts them.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// A set that would make a new entry while the key holds
    /// [`PayloadLimits::max_entries_per_key`] ([`check_entries_per_key`]).
    #[error(
        "entries-per-key: this key holds {held} entries (committed and written in this batch), at most {limit}; \
         entry `{name}` would be a new one"
    )]
    EntriesPerKey {
        /// The entry.
        name: String,
        /// The entries the key holds as the host counts them.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// An emit to a topic the module did not declare.
    #[error("emit-topic: `{topic}` is not among the topics the module declared in `module-info.emits` ({declared})")]
    EmitTopic {
        /// The topic asked for.
        topic: String,
        /// The declared topics, comma-separated, or `none`.
        declared: String,
    },
    /// An emitted message whose key is not canonical.
    #[error("emit-key: the message's key is not canonical: {reason}")]
    EmitKey {
        /// Why.
        reason: KeyError,
    },
    /// An emitted body that is empty or over [`PayloadLimits::max_emit_body`].
    #[error("emit-body-size: an emitted body is 1 to {limit} bytes; this one has {length}")]
    EmitBodySize {
        /// The body's length.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Past [`PayloadLimits::max_emits_per_call`].
    #[error("emits-per-call: one call may emit at most {limit} messages")]
    EmitsPerCall {
        /// The limit.
        limit: usize,
    },
    /// Past [`PayloadLimits::max_emit_bytes_per_call`].
    #[error(
        "emit-bytes-per-call: one call may emit at most {limit} bytes of topics, keys and bodies; this message would \
         make {would}"
    )]
    EmitBytesPerCall {
        /// The limit.
        limit: usize,
        /// The call's total with this message.
        would: usize,
    },
    /// A timer name that is empty, too long or holds a NUL.
    #[error("timer-name: a timer name is 1 to {MAX_TIMER_NAME_BYTES} bytes without NUL; {what}")]
    TimerName {
        /// What is wrong with this one.
        what: String,
    },
    /// A timer payload over the limit.
    #[error("timer-payload-size: timer `{name}` has a payload of {length} bytes, over the limit of {limit} bytes")]
    TimerPayloadSize {
        /// The timer's name.
        name: String,
        /// The payload's length.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// A timer at the largest time, which no clock passes.
    #[error("timer-time: timer `{name}` is set at {at}, the largest time, which no clock ever passes")]
    TimerTime {
        /// The timer's name.
        name: String,
        /// Its time.
        at: i64,
    },
    /// During `fire`, a timer set at or before the time being fired.
    #[error(
        "timer-at-firing: timer `{name}` is set at {at} while the timers at {firing} fire; a call that fires timers \
         sets timers only later than them"
    )]
    TimerAtFiring {
        /// The timer's name.
        name: String,
        /// Its time.
        at: i64,
        /// The time of the timers being fired.
        firing: i64,
    },
    /// A new timer past the per-key limit.
    #[error(
        "timers-per-key: a key holds at most {limit} timers (it holds {held}); timer `{name}` would be a new one \
         (moving or cancelling one is allowed)"
    )]
    TimersPerKey {
        /// The new timer's name.
        name: String,
        /// The timers the key holds.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// A new timer past the projection's limit.
    #[error(
        "timers-in-all: a projection holds at most {limit} timers (it holds {held}); timer `{name}` would be a new one"
    )]
    TimersInAll {
        /// The new timer's name.
        name: String,
        /// The timers the projection holds.
        held: usize,
        /// The limit.
        limit: usize,
    },
}

/// Checks a timer `set` as a value (`timer-name`, `timer-payload-size`,
/// `timer-time`, and during `fire` at `firing`, `timer-at-firing`); the
/// counts are [`check_timers_per_key`] and the host's.
pub fn check_timer(
    limits: &PayloadLimits,
    name: &str,
    at: i64,
    payload_len: usize,
    firing: Option<i64>,
) -> Result<(), Refusal> {
    check_timer_name(name)?;
    if payload_len > limits.max_timer_payload {
        return Err(Refusal::TimerPayloadSize {
            name: quoted(name),
            length: payload_len,
            limit: limits.max_timer_payload,
        });
    }
    if at == i64::MAX {
        return Err(Refusal::TimerTime { name: quoted(name), at });
    }
    match firing {
        Some(firing) if !crate::timers::later_than_firing(at, firing) => {
            Err(Refusal::TimerAtFiring { name: quoted(name), at, firing })
        }
        _ => Ok(()),
    }
}

/// The rules a timer name keeps: 1 to [`MAX_TIMER_NAME_BYTES`] bytes, no
/// NUL.
pub fn check_timer_name(name: &str) -> Result<(), Refusal> {
    if name.is_empty() || name.len() > MAX_TIMER_NAME_BYTES {
        return Err(Refusal::TimerName { what: format!("this one has {} bytes", name.len()) });
    }
    match name.bytes().position(|byte| byte == 0) {
        Some(at) => Err(Refusal::TimerName { what: format!("this one has a NUL at byte {at}") }),
        None => Ok(()),
    }
}

/// Checks a set that would make timer `name` a new one, while the key
/// holds `held` timers (committed, plus its changes in the batch): refused
/// at [`PayloadLimits::max_timers_per_key`].
pub fn check_timers_per_key(limits: &PayloadLimits, name: &str, held: usize) -> Result<(), Refusal> {
    match held < limits.max_timers_per_key {
        true => Ok(()),
        false => Err(Refusal::TimersPerKey { name: quoted(name), held, limit: limits.max_timers_per_key }),
    }
}

/// Checks a set that would make timer `name` a new one, while the
/// projection holds `held` timers (committed, plus those the batches in
/// flight add): refused at [`PayloadLimits::max_timers`].
pub fn check_timers_in_all(limits: &PayloadLimits, name: &str, held: usize) -> Result<(), Refusal> {
    match held < limits.max_timers {
        true => Ok(()),
        false => Err(Refusal::TimersInAll { name: quoted(name), held, limit: limits.max_timers }),
    }
}

/// The rules an entry or counter name keeps: 1 to [`MAX_NAME_BYTES`]
/// bytes, no NUL (so every state store can hold it).
pub fn check_name(name: &str) -> Result<(), Refusal> {
    match name.len() {
        1..=MAX_NAME_BYTES => {}
        length => return Err(Refusal::NameLength { length }),
    }
    match name.bytes().position(|byte| byte == 0) {
        Some(at) => Err(Refusal::NameNul { at }),
        None => Ok(()),
    }
}

/// Checks a change that would make counter `name` a new one, while the
/// projection holds `held` counters (committed, plus those the batches in
/// flight add): refused at [`PayloadLimits::max_counters`].
pub fn check_counter_count(limits: &PayloadLimits, name: &str, held: usize) -> Result<(), Refusal> {
    match held < limits.max_counters {
        true => Ok(()),
        false => Err(Refusal::counter_count(limits, name, held)),
    }
}

/// Checks a set that would make entry `name` a new one, while the key
/// holds `held` entries (committed, plus its writes in the batch): refused
/// at [`PayloadLimits::max_entries_per_key`].
pub fn check_entries_per_key(limits: &PayloadLimits, name: &str, held: usize) -> Result<(), Refusal> {
    match held < limits.max_entries_per_key {
        true => Ok(()),
        false => Err(Refusal::entries_per_key(limits, name, held)),
    }
}

impl Refusal {
    /// The `counter-count` refusal of a new counter `name` while the
    /// projection holds `held` counters, for a host that decided it
    /// itself.
    pub fn counter_count(limits: &PayloadLimits, name: &str, held: usize) -> Self {
        Self::CounterCount { name: quoted(name), held, limit: limits.max_counters }
    }

    /// The `entries-per-key` refusal of a new entry `name` while the key
    /// holds `held` entries, for a host that decided it itself.
    pub fn entries_per_key(limits: &PayloadLimits, name: &str, held: usize) -> Self {
        Self::EntriesPerKey { name: quoted(name), held, limit: limits.max_entries_per_key }
    }
}

/// A counter's value as a key reads it: refused when outside `i64`.
pub fn counter_value(name: &str, value: i128) -> Result<i64, Refusal> {
    i64::try_from(value).map_err(|_| Refusal::CounterOutOfRange { name: name.to_owned(), value })
}

/// What one `handle` call has handed the host so far, checked against
/// [`PayloadLimits`]. Each method checks one import call's values and, when
/// they pass, counts them; a refused call counts nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTally {
    /// Accepted `set` and `delete` calls.
    pub state_writes: usize,
    /// Bytes of their names and values.
    pub state_bytes: usize,
    /// Accepted `counter-add` calls.
    pub counter_changes: usize,
    /// Accepted emits.
    pub emits: usize,
    /// Bytes of their topics, keys and bodies.
    pub emit_bytes: usize,
    /// What the host holds for all of it, as the batch budget counts: the
    /// most a key's footprint can grow by in this call (a rewrite of an
    /// entry the key already holds grows it by less).
    pub held: usize,
}

impl CallTally {
    /// Checks a `set` of `name` to a value of `value_len` bytes.
    pub fn set(&mut self, limits: &PayloadLimits, name: &str, value_len: usize) -> Result<(), Refusal> {
        check_name(name)?;
        if value_len > limits.max_state_value {
            return Err(Refusal::StateValueSize {
                name: name.to_owned(),
                length: value_len,
                limit: limits.max_state_value,
            });
        }
        self.write(limits, name.len() + value_len)
    }

    /// Checks a `delete` of `name`.
    pub fn delete(&mut self, limits: &PayloadLimits, name: &str) -> Result<(), Refusal> {
        check_name(name)?;
        self.write(limits, name.len())
    }

    fn write(&mut self, limits: &PayloadLimits, bytes: usize) -> Result<(), Refusal> {
        if self.state_writes >= limits.max_state_writes_per_call {
            return Err(Refusal::StateWritesPerCall { limit: limits.max_state_writes_per_call });
        }
        let would = self.state_bytes.saturating_add(bytes);
        if would > limits.max_state_bytes_per_call {
            return Err(Refusal::StateBytesPerCall { limit: limits.max_state_bytes_per_call, would });
        }
        self.state_writes += 1;
        self.state_bytes = would;
        self.held = self.held.saturating_add(bytes + WRITE_OVERHEAD);
        Ok(())
    }

    /// Checks a timer `set` of `name` at `at` with a payload of
    /// `payload_len` bytes (during `fire` at `firing`): the timer's own
    /// rules ([`check_timer`]), then, as a state write, against
    /// `state-writes-per-call` and `state-bytes-per-call` (timers are kept
    /// with the state).
    pub fn timer_set(
        &mut self,
        limits: &PayloadLimits,
        name: &str,
        at: i64,
        payload_len: usize,
        firing: Option<i64>,
    ) -> Result<(), Refusal> {
        check_timer(limits, name, at, payload_len, firing)?;
        self.write(limits, name.len() + payload_len)
    }

    /// Checks a timer `cancel` of `name`: a state write of its name.
    pub fn timer_cancel(&mut self, limits: &PayloadLimits, name: &str) -> Result<(), Refusal> {
        check_timer_name(name)?;
        self.write(limits, name.len())
    }

    /// Checks a `counter-add` of `delta` to counter `name`, whose value as
    /// the key sees it is `current`; returns the value afterwards.
    pub fn counter_add(
        &mut self,
        limits: &PayloadLimits,
        name: &str,
        current: i128,
        delta: i64,
    ) -> Result<i128, Refusal> {
        check_name(name)?;
        if self.counter_changes >= limits.max_counter_changes_per_call {
            return Err(Refusal::CounterChangesPerCall { limit: limits.max_counter_changes_per_call });
        }
        let next = current.saturating_add(i128::from(delta));
        if i64::try_from(next).is_err() {
            return Err(Refusal::CounterOverflow { name: name.to_owned(), value: current, delta });
        }
        self.counter_changes += 1;
        self.held = self.held.saturating_add(name.len() + WRITE_OVERHEAD);
        Ok(next)
    }

    /// Checks an emit of `body` with key bytes `key` to `topic`, which must
    /// be among `declared`; returns the checked key.
    pub fn emit(
        &mut self,
        limits: &PayloadLimits,
        declared: &[impl AsRef<str>],
        topic: &str,
        key: &[u8],
        body: &[u8],
    ) -> Result<Key, Refusal> {
        if !declared.iter().any(|known| known.as_ref() == topic) {
            let declared: Vec<&str> = declared.iter().map(AsRef::as_ref).collect();
            return Err(Refusal::EmitTopic {
                topic: quoted(topic),
                declared: if declared.is_empty() { "none".to_owned() } else { declared.join(", ") },
            });
        }
        if body.is_empty() || body.len() > limits.max_emit_body {
            return Err(Refusal::EmitBodySize { length: body.len(), limit: limits.max_emit_body });
        }
        let key = Key::from_canonical(key).map_err(|reason| Refusal::EmitKey { reason })?;
        if self.emits >= limits.max_emits_per_call {
            return Err(Refusal::EmitsPerCall { limit: limits.max_emits_per_call });
        }
        let bytes = topic.len() + key.as_bytes().len() + body.len();
        let would = self.emit_bytes.saturating_add(bytes);
        if would > limits.max_emit_bytes_per_call {
            return Err(Refusal::EmitBytesPerCall { limit: limits.max_emit_bytes_per_call, would });
        }
        self.emits += 1;
        self.emit_bytes = would;
        self.held = self.held.saturating_add(bytes + EMIT_OVERHEAD);
        Ok(key)
    }
}

/// The log lines of one call: each cut to [`PayloadLimits::max_log_line`],
/// at most [`PayloadLimits::max_log_lines_per_call`] of them, the rest
/// counted. Logging never fails a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogTally {
    lines: usize,
    dropped: usize,
}

/// A log line as it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// The line, cut to the limit.
    pub text: &'a str,
    /// Whether it was cut (show it marked).
    pub cut: bool,
}

impl fmt::Display for LogLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cut { write!(f, "{} […cut]", self.text) } else { f.write_str(self.text) }
    }
}

impl LogTally {
    /// The line to keep for `message`, or `None` when the call has logged
    /// its limit of lines (it is counted for the closing line).
    pub fn admit<'a>(&mut self, limits: &PayloadLimits, message: &'a str) -> Option<LogLine<'a>> {
        if self.lines >= limits.max_log_lines_per_call {
            self.dropped += 1;
            return None;
        }
        self.lines += 1;
        let (text, cut) = cut(message, limits.max_log_line);
        Some(LogLine { text, cut })
    }

    /// Ends a call: the closing line saying how many lines were dropped, if
    /// any; the tally starts again at zero.
    pub fn finish(&mut self, limits: &PayloadLimits) -> Option<String> {
        let dropped = std::mem::take(self).dropped;
        (dropped > 0).then(|| {
            format!(
                "log-lines-per-call: {dropped} more log lines of this call dropped (at most {} per call)",
                limits.max_log_lines_per_call
            )
        })
    }
}

/// A value a module's export returned that the host cannot use, naming the
/// rule it broke. At load ([`check_description`]) it refuses the module; in
/// a call it fails the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// One import call, or one export's answer, handed the host more than
    /// [`PayloadLimits::most_lifted_per_call`]: refused before it was
    /// copied, and the instance is replaced.
    #[error(
        "import-size: one import call, or an export's answer, may hand the host at most {limit} bytes (the largest \
         value the payload limits allow, a key, and room for names); this one handed more"
    )]
    ImportSize {
        /// The bound, in bytes.
        limit: usize,
    },
    /// Too few or too many event types.
    #[error("event-type-count: a module handles 1 to {MAX_EVENT_TYPES} event types; this one declares {count}")]
    EventTypeCount {
        /// How many it declares.
        count: usize,
    },
    /// One tag declared twice.
    #[error("event-type-tag: tag {tag} is declared twice")]
    DuplicateTag {
        /// The tag.
        tag: u32,
    },
    /// The tag the host reserves for the dead letters of timers
    /// ([`RESERVED_TAG`]): a module declaring it would be handed them.
    #[error(
        "event-type-tag-reserved: event type `{name}` declares tag {RESERVED_TAG}, which the host reserves for the \
         dead letters of timers; give it another tag"
    )]
    ReservedTag {
        /// The event type's name (cut when long).
        name: String,
    },
    /// A name that breaks the rule for event type names.
    #[error(
        "event-type-name: tag {tag} is named `{name}`; a name is 1 to {MAX_EVENT_TYPE_NAME_BYTES} bytes of letters, \
         digits, `_`, `-`, `.` and `:`"
    )]
    EventTypeName {
        /// The tag.
        tag: u32,
        /// Its name (cut when long).
        name: String,
    },
    /// A max batch of 0.
    #[error("max-batch: event type `{name}` declares max-batch 0 (it must be at least 1)")]
    MaxBatch {
        /// The event type's name.
        name: String,
    },
    /// Too many emit topics.
    #[error("emit-topic-count: a module declares at most {MAX_EMIT_TOPICS} emit topics; this one declares {count}")]
    EmitTopicCount {
        /// How many it declares.
        count: usize,
    },
    /// A declared emit topic that is not a topic name.
    #[error(
        "emit-topic-name: `{topic}` is not a topic name (1 to {MAX_TOPIC_NAME_BYTES} bytes of letters, digits, `_`, \
         `-` and `.`)"
    )]
    EmitTopicName {
        /// The topic (cut when long).
        topic: String,
    },
    /// A declared emit topic that belongs to the host.
    #[error("emit-topic-host-owned: `{topic}` is the host's own (modules never write to `retry_*` or `dlq_*` topics)")]
    HostOwnedTopic {
        /// The topic.
        topic: String,
    },
    /// One emit topic declared twice.
    #[error("emit-topic-duplicate: `{topic}` is declared twice")]
    DuplicateTopic {
        /// The topic.
        topic: String,
    },
    /// A `key` answer that is not a canonical key.
    #[error("key-canonical: the key the module returned is not canonical: {reason}")]
    KeyNotCanonical {
        /// Why.
        reason: KeyError,
    },
    /// An event type declared `timed` whose event has no event time: its
    /// `event-time` answered none, or its message carries no
    /// `waku-event-time` header.
    #[error(
        "event-time-declared: event type `{name}` (tag {tag}) declares event time, but {}",
        if *from_module { "`event-time` returned none for this body" } else { "the message carries no `waku-event-time` header" }
    )]
    EventTimeDeclared {
        /// The event type's name.
        name: String,
        /// Its tag.
        tag: u32,
        /// Whether the module's `event-time` answered none (else the
        /// message lacks the header).
        from_module: bool,
    },
    /// A `combine` answer that is empty or over
    /// [`PayloadLimits::max_emit_body`].
    #[error("combine-body-size: `combine` returns a body of 1 to {limit} bytes; this one has {length}")]
    CombinedBodySize {
        /// Its length.
        length: usize,
        /// The limit.
        limit: usize,
    },
}

/// Checks what `describe` returned: 1 to [`MAX_EVENT_TYPES`] event types
/// given as `(tag, name, max_batch)`, tags unique, names valid, none the
/// [`RESERVED_TAG`], max batch at least 1; at most [`MAX_EMIT_TOPICS`] emit topics, each a valid topic
/// name, none of the host's own, none twice.
pub fn check_description<'a>(
    event_types: impl ExactSizeIterator<Item = (u32, &'a str, u32)>,
    emits: &[impl AsRef<str>],
) -> Result<(), ContractError> {
    let count = event_types.len();
    if count == 0 || count > MAX_EVENT_TYPES {
        return Err(ContractError::EventTypeCount { count });
    }
    let mut tags = Vec::with_capacity(count);
    for (tag, name, max_batch) in event_types {
        if tags.contains(&tag) {
            return Err(ContractError::DuplicateTag { tag });
        }
        tags.push(tag);
        if !is_event_type_name(name) {
            return Err(ContractError::EventTypeName { tag, name: quoted(name) });
        }
        if tag == RESERVED_TAG {
            return Err(ContractError::ReservedTag { name: name.to_owned() });
        }
        if max_batch == 0 {
            return Err(ContractError::MaxBatch { name: name.to_owned() });
        }
    }
    if emits.len() > MAX_EMIT_TOPICS {
        return Err(ContractError::EmitTopicCount { count: emits.len() });
    }
    for (index, topic) in emits.iter().map(AsRef::as_ref).enumerate() {
        if !is_topic_name(topic) {
            return Err(ContractError::EmitTopicName { topic: quoted(topic) });
        }
        if is_host_topic(topic) {
            return Err(ContractError::HostOwnedTopic { topic: topic.to_owned() });
        }
        if emits[..index].iter().any(|earlier| earlier.as_ref() == topic) {
            return Err(ContractError::DuplicateTopic { topic: topic.to_owned() });
        }
    }
    Ok(())
}

/// Checks a key the module's `key` export returned.
pub fn check_key(bytes: &[u8]) -> Result<Key, ContractError> {
    Key::from_canonical(bytes).map_err(|reason| ContractError::KeyNotCanonical { reason })
}

/// Checks a body `combine` returned: 1 byte to
/// [`PayloadLimits::max_emit_body`].
pub fn check_combined_body(limits: &PayloadLimits, body: &[u8]) -> Result<(), ContractError> {
    if body.is_empty() || body.len() > limits.max_emit_body {
        return Err(ContractError::CombinedBodySize { length: body.len(), limit: limits.max_emit_body });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> PayloadLimits {
        PayloadLimits {
            max_state_value: 8,
            max_state_writes_per_call: 3,
            max_state_bytes_per_call: 20,
            max_counter_changes_per_call: 2,
            max_emit_body: 8,
            max_emits_per_call: 2,
            max_emit_bytes_per_call: 24,
            max_log_line: 5,
            max_log_lines_per_call: 2,
            max_batch_held: 64 << 20,
            max_counters: 3,
            max_entries_per_key: 2,
            max_timer_payload: 4,
            max_timers_per_key: 2,
            max_timers: 5,
        }
    }

    /// The rule id a refusal's message starts with.
    fn rule(error: impl fmt::Display) -> String {
        error.to_string().split(':').next().unwrap().to_owned()
    }

    #[test]
    fn the_contract_is_read_from_the_wit_file() {
        assert!(CONTRACT.starts_with("wakuwaku:handler@"), "{CONTRACT}");
        assert!(include_str!("../../wit/handler-0.5.wit").contains(&format!("package {CONTRACT};")));
        assert_eq!(CONTRACT_0_2, "wakuwaku:handler@0.2.0", "the 0.2 contract is kept as it was");
        assert_eq!(CONTRACT_0_3, "wakuwaku:handler@0.3.0", "the 0.3 contract is kept as it was");
        assert_eq!(CONTRACT_0_4, "wakuwaku:handler@0.4.0", "the 0.4 contract is kept as it was");
        assert_eq!(CONTRACT, "wakuwaku:handler@0.5.0");
        assert_eq!(package_of("// x\npackage a:b@1.2.3;\nworld w {}"), "a:b@1.2.3");
    }

    #[test]
    fn names_are_one_to_256_bytes() {
        assert_eq!(rule(check_name("").unwrap_err()), "name-length");
        assert_eq!(rule(check_name(&"n".repeat(257)).unwrap_err()), "name-length");
        check_name("n").unwrap();
        check_name(&"n".repeat(256)).unwrap();
    }

    #[test]
    fn names_hold_no_nul() {
        assert_eq!(check_name("a\0b").unwrap_err(), Refusal::NameNul { at: 1 });
        assert_eq!(rule(check_name("\0").unwrap_err()), "name-nul");
        // Past the length rule first: a huge name is refused for its length.
        assert_eq!(rule(check_name(&"\0".repeat(300)).unwrap_err()), "name-length");
        check_name("é\u{1}\u{7f}").unwrap();
    }

    #[test]
    fn state_writes_are_checked_then_counted() {
        let limits = small();
        let mut tally = CallTally::default();
        let refusal = tally.set(&limits, "big", 9).unwrap_err();
        assert_eq!(refusal.to_string(), "state-value-size: state value `big` has 9 bytes, over the limit of 8 bytes");
        assert_eq!(tally, CallTally::default(), "a refused write counts nothing");
        tally.set(&limits, "a", 8).unwrap();
        tally.delete(&limits, "bb").unwrap();
        assert_eq!((tally.state_writes, tally.state_bytes), (2, 11));
        assert_eq!(tally.held, 11 + 2 * WRITE_OVERHEAD);
        // 11 + 1 + 8 = 20 fits; one more write of anything does not.
        let refusal = tally.set(&limits, "c", 9).unwrap_err();
        assert_eq!(rule(&refusal), "state-value-size");
        tally.set(&limits, "c", 8).unwrap();
        assert_eq!(rule(tally.delete(&limits, "d").unwrap_err()), "state-writes-per-call");
        let mut tally = CallTally::default();
        tally.set(&limits, "aaaaaaaaaaaa", 8).unwrap();
        let refusal = tally.set(&limits, "b", 1).unwrap_err();
        assert_eq!(refusal, Refusal::StateBytesPerCall { limit: 20, would: 22 });
        assert_eq!(rule(tally.delete(&limits, "").unwrap_err()), "name-length");
    }

    #[test]
    fn counters_stay_in_range_as_the_key_sees_them() {
        let limits = small();
        let mut tally = CallTally::default();
        assert_eq!(tally.counter_add(&limits, "c", i128::from(i64::MAX) - 1, 1), Ok(i128::from(i64::MAX)));
        let refusal = tally.counter_add(&limits, "c", i128::from(i64::MAX), 1).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "counter-range: counter `c` is 9223372036854775807 as this key sees it; adding 1 leaves the s64 range"
        );
        assert_eq!(tally.counter_changes, 1, "the refused change is not counted");
        // A committed value outside the range (several keys' changes) may
        // come back into it, and reads of it are refused.
        assert_eq!(tally.counter_add(&limits, "c", i128::from(i64::MAX) + 5, -5), Ok(i128::from(i64::MAX)));
        assert_eq!(rule(tally.counter_add(&limits, "c", 0, 1).unwrap_err()), "counter-changes-per-call");
        assert_eq!(rule(counter_value("c", i128::from(i64::MIN) - 1).unwrap_err()), "counter-range");
        assert_eq!(counter_value("c", -3), Ok(-3));
    }

    #[test]
    fn new_counters_and_entries_stop_at_their_quota_with_the_numbers_in_the_refusal() {
        let limits = small();
        check_counter_count(&limits, "c", 2).unwrap();
        let refusal = check_counter_count(&limits, "c", 3).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "counter-count: the projection holds 3 counters (committed and pending), at most 3; counter `c` would \
             be a new one"
        );
        check_entries_per_key(&limits, "e", 1).unwrap();
        let refusal = check_entries_per_key(&limits, "e", 2).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "entries-per-key: this key holds 2 entries (committed and written in this batch), at most 2; entry `e` \
             would be a new one"
        );
        // A long name is cut in the message.
        let long = "n".repeat(MAX_NAME_BYTES);
        assert!(
            check_entries_per_key(&limits, &long, 9).unwrap_err().to_string().contains(&format!("`{}…`", &long[..64]))
        );
    }

    #[test]
    fn emits_go_to_declared_topics_with_canonical_keys_and_bounded_bodies() {
        let limits = small();
        let declared = ["out"];
        let key = Key::int(7).as_bytes().to_vec();
        let mut tally = CallTally::default();
        let refusal = tally.emit(&limits, &declared, "dlq_in", &key, b"b").unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "emit-topic: `dlq_in` is not among the topics the module declared in `module-info.emits` (out)"
        );
        let none: [&str; 0] = [];
        assert!(tally.emit(&limits, &none, "out", &key, b"b").unwrap_err().to_string().ends_with("(none)"));
        assert_eq!(rule(tally.emit(&limits, &declared, "out", &key, b"").unwrap_err()), "emit-body-size");
        assert_eq!(rule(tally.emit(&limits, &declared, "out", &key, &[1; 9]).unwrap_err()), "emit-body-size");
        let refusal = tally.emit(&limits, &declared, "out", &[0x01, 0x80, 0x00], b"b").unwrap_err();
        assert_eq!(refusal, Refusal::EmitKey { reason: KeyError::NotShortest { at: 1 } });
        assert_eq!(tally, CallTally::default());
        assert_eq!(tally.emit(&limits, &declared, "out", &key, b"12345678"), Ok(Key::int(7)));
        // 3 + 2 + 8 = 13; another 13 would make 26 > 24.
        let refusal = tally.emit(&limits, &declared, "out", &key, b"12345678").unwrap_err();
        assert_eq!(refusal, Refusal::EmitBytesPerCall { limit: 24, would: 26 });
        tally.emit(&limits, &declared, "out", &key, b"1").unwrap();
        assert_eq!(rule(tally.emit(&limits, &declared, "out", &key, b"1").unwrap_err()), "emits-per-call");
        assert_eq!(tally.held, 13 + 6 + 2 * EMIT_OVERHEAD);
    }

    #[test]
    fn timers_are_checked_as_values_and_counted_as_state_writes() {
        let limits = PayloadLimits {
            max_timer_payload: 4,
            max_state_writes_per_call: 3,
            max_timers_per_key: 2,
            max_timers: 5,
            ..PayloadLimits::default()
        };
        let mut tally = CallTally::default();
        let long = "n".repeat(MAX_TIMER_NAME_BYTES + 1);
        let refused = |result: Result<(), Refusal>| rule(result.unwrap_err());
        assert_eq!(refused(tally.timer_set(&limits, "", 1, 0, None)), "timer-name");
        assert_eq!(refused(tally.timer_set(&limits, &long, 1, 0, None)), "timer-name");
        assert_eq!(refused(tally.timer_set(&limits, "a\0b", 1, 0, None)), "timer-name");
        assert_eq!(refused(tally.timer_set(&limits, "close", 1, 5, None)), "timer-payload-size");
        assert_eq!(refused(tally.timer_set(&limits, "close", i64::MAX, 0, None)), "timer-time");
        assert_eq!(refused(tally.timer_set(&limits, "close", 7, 0, Some(7))), "timer-at-firing");
        assert_eq!(refused(tally.timer_set(&limits, "close", 6, 0, Some(7))), "timer-at-firing");
        assert_eq!(tally, CallTally::default(), "refused calls count nothing");
        tally.timer_set(&limits, "close", 8, 4, Some(7)).unwrap();
        tally.timer_set(&limits, "close", i64::MIN, 0, None).unwrap();
        tally.timer_cancel(&limits, "close").unwrap();
        assert_eq!((tally.state_writes, tally.state_bytes), (3, 5 + 4 + 5 + 5));
        assert_eq!(refused(tally.timer_cancel(&limits, "close")), "state-writes-per-call");
        check_timers_per_key(&limits, "x", 1).unwrap();
        assert_eq!(refused(check_timers_per_key(&limits, "x", 2)), "timers-per-key");
        check_timers_in_all(&limits, "x", 4).unwrap();
        let message = check_timers_in_all(&limits, "x", 5).unwrap_err().to_string();
        assert!(message.starts_with("timers-in-all: a projection holds at most 5 timers"), "{message}");
        assert!(PayloadLimits { max_timers: 0, ..PayloadLimits::default() }.check().is_err());
    }

    #[test]
    fn log_lines_are_cut_and_counted() {
        let limits = small();
        let mut tally = LogTally::default();
        assert_eq!(tally.admit(&limits, "short").map(|l| l.to_string()), Some("short".to_owned()));
        assert_eq!(tally.admit(&limits, "ééé").map(|l| l.to_string()), Some("éé […cut]".to_owned()));
        assert_eq!(tally.admit(&limits, "third"), None);
        assert_eq!(tally.admit(&limits, "fourth"), None);
        assert_eq!(
            tally.finish(&limits).as_deref(),
            Some("log-lines-per-call: 2 more log lines of this call dropped (at most 2 per call)")
        );
        assert!(tally.admit(&limits, "again").is_some(), "the next call starts afresh");
        assert_eq!(tally.finish(&limits), None);
    }

    #[test]
    fn descriptions_are_checked_rule_by_rule() {
        let ok = |tag| (tag, "Type", 1);
        let none: [&str; 0] = [];
        check_description([ok(1), ok(2)].into_iter(), &["out", "a.b-c_d"]).unwrap();
        type Case = (Vec<(u32, &'static str, u32)>, Vec<String>, &'static str);
        let cases: [Case; 10] = [
            (vec![], vec![], "event-type-count"),
            (vec![ok(1); MAX_EVENT_TYPES + 1], vec![], "event-type-count"),
            (vec![ok(1), ok(1)], vec![], "event-type-tag"),
            (vec![(1, "", 1)], vec![], "event-type-name"),
            (vec![(1, "no spaces", 1)], vec![], "event-type-name"),
            (vec![(1, "Type", 0)], vec![], "max-batch"),
            (vec![ok(1), (u32::MAX, "Type", 1)], vec![], "event-type-tag-reserved"),
            (vec![ok(1)], (0..=MAX_EMIT_TOPICS).map(|i| format!("t{i}")).collect(), "emit-topic-count"),
            (vec![ok(1)], vec!["a/b".into()], "emit-topic-name"),
            (vec![ok(1)], vec!["retry_x".into()], "emit-topic-host-owned"),
        ];
        for (types, emits, expected) in cases {
            let error = check_description(types.into_iter(), &emits).unwrap_err();
            assert_eq!(rule(&error), expected, "{error}");
        }
        assert_eq!(rule(check_description([ok(1)].into_iter(), &["dlq_x"]).unwrap_err()), "emit-topic-host-owned");
        assert_eq!(rule(check_description([ok(1)].into_iter(), &["a", "a"]).unwrap_err()), "emit-topic-duplicate");
        assert_eq!(rule(check_description([ok(1)].into_iter(), &[&"t".repeat(256)]).unwrap_err()), "emit-topic-name");
        check_description([ok(1)].into_iter(), &none).unwrap();
        assert!(is_event_type_name(&"n".repeat(128)) && !is_event_type_name(&"n".repeat(129)));
        assert!(is_event_type_name("bank:Deposited.v2"));
    }

    #[test]
    fn return_values_keys_combined_bodies_and_error_messages() {
        assert_eq!(check_key(&[0x01, 0x54]), Ok(Key::int(42)));
        assert_eq!(rule(check_key(&[0x01, 0x80, 0x00]).unwrap_err()), "key-canonical");
        assert_eq!(rule(check_key(&vec![0x03; 2000]).unwrap_err()), "key-canonical");
        let limits = small();
        check_combined_body(&limits, b"x").unwrap();
        assert_eq!(rule(check_combined_body(&limits, b"").unwrap_err()), "combine-body-size");
        assert_eq!(rule(check_combined_body(&limits, &[0; 9]).unwrap_err()), "combine-body-size");
        let long = "é".repeat(MAX_ERROR_MESSAGE_BYTES);
        let kept = error_message(long);
        assert!(kept.len() <= MAX_ERROR_MESSAGE_BYTES + " […cut]".len() && kept.ends_with(" […cut]"));
        assert_eq!(error_message("short".into()), "short");
    }

    #[test]
    fn limits_are_checked_whole() {
        PayloadLimits::default().check().unwrap();
        assert!(PayloadLimits::default().most_held_by_one_call() < 10 << 20, "one call stays under 10 MiB");
        let zero = PayloadLimits { max_emits_per_call: 0, ..PayloadLimits::default() };
        assert_eq!(zero.check(), Err(LimitsError::Zero("max_emits_per_call")));
        let zero = PayloadLimits { max_counters: 0, ..PayloadLimits::default() };
        assert_eq!(zero.check(), Err(LimitsError::Zero("max_counters")));
        let zero = PayloadLimits { max_entries_per_key: 0, ..PayloadLimits::default() };
        assert_eq!(zero.check(), Err(LimitsError::Zero("max_entries_per_key")));
        let tight = PayloadLimits { max_batch_held: 1 << 20, ..PayloadLimits::default() };
        assert!(matches!(tight.check(), Err(LimitsError::BatchBelowCall { .. })));
    }
}
