//! A handler module written by an attacker: against the raw WIT
//! (`wit/handler.wit`, the 0.2 contract, world `module`) through
//! `wit-bindgen` alone, without the guest SDK and its guard rails. It stays
//! on 0.2, the contract the host still loads unchanged: the imports it
//! attacks are the same in 0.3 and served by the same code. Each event type is one attack on the
//! host; the body (JSON, see [`Params`]) picks the attack's size, so tests
//! can scale it. The tags (200 and up) collide with none of the bank's
//! (1–5), the probe's or the liar's.
//!
//! What the module reports, so a test can check what the host did:
//! - the state entry `report` of the key (JSON: `accepted`, `refused` per
//!   rule, the `first` refusal message per rule, and `outcomes`, one per
//!   import call for the small attacks: `ok`, `= <value>` or the rule id);
//! - counters `<attack>.accepted` and `<attack>.refused.<rule>`.
//!
//! Either may itself be refused (a flood of writes leaves no room for the
//! report entry, a flood of counter changes none for the counters); the
//! module ignores that, as an attacker would. With `"then": "return"` the
//! first refusal is returned as the call's `handler-error` instead (class
//! `class`, default unrecoverable), so the events go where that class says.
//!
//! Outside `handle` (in `describe`, `key`, `ordering` and `combine`) every
//! state and emit import must be refused: the module tries them all on
//! every such call and traps if any is accepted, so a module that loads
//! and publishes proves they were refused.
//!
//! It declares one emit topic, [`OUT`], which must exist when it loads.

#[cfg(target_arch = "wasm32")]
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::Deserialize;

#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/handler.wit", world: "module" });
}

use bindings::exports::wakuwaku::handler::handler::{Guest, MessageOrdering};
use bindings::wakuwaku::handler::types::{Algebra, ErrorClass, EventType, HandlerError, ModuleInfo, Outgoing};
use bindings::wakuwaku::handler::{emit, log, state};

/// The one topic the module declares it emits to.
pub const OUT: &str = "hostile_out";

/// Terminal control sequences (colour, clear screen, window title, a
/// carriage return over the line) and a line break before a forged line:
/// what a module could smuggle into an operator's terminal or log through
/// its log lines and error messages.
pub const ESCAPES: &str = "\u{1b}[31mred\u{1b}[0m \u{1b}[2J\u{1b}]0;owned\u{7}\roverwritten\nwaku: forged line";

/// How the module misbehaves in its exports, whatever the event: patched
/// into the built component by a test, in place (the bytes after
/// `WAKU_HOSTILE_LOAD_MODE=`, padded with spaces), so one build gives every
/// variant. `<export>-<act>`: the export (`describe`, `key`, `ordering`,
/// `combine`, `handle`) writes [`ESCAPES`] to standard error (`stderr`),
/// panics with them (`panic`) or spins until its CPU budget ends it
/// (`loop`). `none` as built.
pub static WAKU_HOSTILE_LOAD_MODE: [u8; 48] = *b"WAKU_HOSTILE_LOAD_MODE=none                     ";

/// Misbehaves in `export` as [`WAKU_HOSTILE_LOAD_MODE`] says.
fn misbehave(export: &str) {
    // Read through a volatile load, so the compiler keeps the bytes a
    // test patches instead of folding the constant.
    // SAFETY: a read of a static's bytes, which nothing writes.
    let marker: [u8; 48] = unsafe { std::ptr::read_volatile(&WAKU_HOSTILE_LOAD_MODE) };
    let mode = std::str::from_utf8(&marker[23..]).unwrap_or("").trim_end();
    let Some((target, act)) = mode.split_once('-') else { return };
    if target != export {
        return;
    }
    match act {
        "stderr" => eprintln!("{ESCAPES}"),
        "panic" => panic!("{ESCAPES}"),
        "loop" => loop {
            std::hint::black_box(&marker);
        },
        _ => {}
    }
}

/// The attacks, one event type each: (tag, name, algebra, max batch).
/// Floods take one event per call, so a test knows how many calls it made.
const ATTACKS: &[(u32, &str, Algebra, u32)] = &[
    (200, "EmitUndeclared", Algebra::NonAssociative, 1),
    (201, "EmitHostTopic", Algebra::NonAssociative, 1),
    (202, "EmitBadTopic", Algebra::NonAssociative, 1),
    (203, "EmitBadBody", Algebra::NonAssociative, 1),
    (204, "EmitBadKey", Algebra::NonAssociative, 1),
    (205, "EmitFlood", Algebra::NonAssociative, 1),
    (206, "SetFlood", Algebra::NonAssociative, 1),
    (207, "CounterOverflow", Algebra::NonAssociative, 1),
    (208, "SharedCounter", Algebra::NonAssociative, 1),
    (209, "BadNames", Algebra::NonAssociative, 1),
    (210, "LogFlood", Algebra::NonAssociative, 1),
    (211, "HugeError", Algebra::NonAssociative, 1),
    (212, "BadKeyExport", Algebra::NonAssociative, 1),
    (213, "HugeCombine", Algebra::Associative, 64),
    (214, "CounterNames", Algebra::NonAssociative, 1),
    (215, "DeleteFlood", Algebra::NonAssociative, 1),
    (216, "RefusalSpin", Algebra::NonAssociative, 1),
    (217, "NotUtf8", Algebra::NonAssociative, 1),
    (218, "Behave", Algebra::NonAssociative, 16),
    (219, "CollidingNames", Algebra::NonAssociative, 1),
    (220, "CollidingCounters", Algebra::NonAssociative, 1),
    (221, "Transient", Algebra::NonAssociative, 1),
    (222, "BigValues", Algebra::NonAssociative, 1),
    (223, "Sleep", Algebra::NonAssociative, 1),
    (224, "Exit", Algebra::NonAssociative, 1),
    (225, "Random", Algebra::NonAssociative, 1),
    (226, "Handles", Algebra::NonAssociative, 1),
    (227, "ArmAllocator", Algebra::NonAssociative, 1),
];

/// What an event asks for. Every field is optional but `key`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Params {
    /// The event's key (an integer key).
    pub key: u64,
    /// How many times to repeat the attack's step; 0 means until refused
    /// (or, for `RefusalSpin`, forever: until the CPU budget ends the call).
    pub n: u64,
    /// The size of each value, body, line, name or message, in bytes.
    pub size: u64,
    /// A variant of the attack (see each attack).
    pub mode: String,
    /// A topic to attack (`EmitUndeclared`, `EmitHostTopic`).
    pub topic: String,
    /// A counter name (`CounterOverflow`, `SharedCounter`); the one name
    /// `BadNames` tries on every state import.
    pub name: String,
    /// A counter delta (`SharedCounter`).
    pub delta: i64,
    /// Distinguishes events of one key (names of floods).
    pub seq: u64,
    /// `return`: return the first refusal as the call's error.
    pub then: String,
    /// `Handles`: keep the handles open after the call (a leak).
    pub leak: bool,
    /// The class of a returned error: `transient`, `retryable` or
    /// `unrecoverable` (the default).
    pub class: String,
}

/// The attack an event type stands for.
fn attack(tag: u32) -> Option<&'static str> {
    ATTACKS.iter().find(|(t, ..)| *t == tag).map(|(_, name, ..)| *name)
}

fn parse_params(body: &[u8]) -> Result<Params, HandlerError> {
    serde_json::from_slice(body).map_err(|e| error(ErrorClass::Unrecoverable, format!("not a hostile body: {e}")))
}

fn error(class: ErrorClass, message: String) -> HandlerError {
    HandlerError { class, message }
}

fn class(name: &str) -> ErrorClass {
    match name {
        "transient" => ErrorClass::Transient,
        "retryable" => ErrorClass::Retryable,
        _ => ErrorClass::Unrecoverable,
    }
}

/// The canonical bytes of an integer key: `0x01`, then the zigzag form as
/// shortest unsigned LEB128 (written from the WIT docs, as another guest
/// language would).
pub fn int_key(value: i128) -> Vec<u8> {
    let zigzag = if value >= 0 { (value as u128) << 1 } else { ((-(value + 1)) as u128) << 1 | 1 };
    let mut bytes = vec![0x01];
    leb128(&mut bytes, zigzag);
    bytes
}

fn leb128(out: &mut Vec<u8>, mut value: u128) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The canonical bytes of a string key: `0x02`, the byte length as
/// LEB128, the bytes.
fn string_key(text: &str) -> Vec<u8> {
    let mut key = vec![0x02];
    leb128(&mut key, text.len() as u128);
    key.extend_from_slice(text.as_bytes());
    key
}

/// A canonical byte-string key of `len` bytes in all.
fn bytes_key(len: usize) -> Vec<u8> {
    // 0x03, a 2-byte LEB128 length (for lengths 128..16383), the bytes.
    let payload = len - 3;
    let mut key = vec![0x03];
    leb128(&mut key, payload as u128);
    assert_eq!(key.len(), 3, "lengths from 131 to 16386 only");
    key.resize(len, b'k');
    key
}

fn outgoing(topic: &str, key: Vec<u8>, body: Vec<u8>) -> Outgoing {
    Outgoing {
        topic: topic.to_owned(),
        tag: 218,
        key,
        ordering: MessageOrdering::Relaxed,
        algebra: Algebra::NonAssociative,
        body,
    }
}

/// The rule id a refusal starts with (`emit-topic: …` → `emit-topic`).
fn rule(refusal: &str) -> String {
    refusal.split(':').next().unwrap_or(refusal).to_owned()
}

/// What the host did with each import call of one `handle` call.
#[derive(Default)]
struct Report {
    attack: &'static str,
    accepted: u64,
    refused: BTreeMap<String, u64>,
    first: BTreeMap<String, String>,
    outcomes: Vec<String>,
}

impl Report {
    fn new(attack: &'static str) -> Self {
        Self { attack, ..Self::default() }
    }

    /// Counts one import call's result; true when it was accepted.
    fn note<T>(&mut self, result: Result<T, String>) -> bool {
        match result {
            Ok(_) => {
                self.accepted += 1;
                true
            }
            Err(refusal) => {
                let rule = rule(&refusal);
                *self.refused.entry(rule.clone()).or_default() += 1;
                self.first.entry(rule).or_insert(refusal);
                false
            }
        }
    }

    /// Counts a call and lists its outcome: `ok`, or the rule it broke.
    fn step(&mut self, result: Result<(), String>) {
        let outcome = match &result {
            Ok(()) => "ok".to_owned(),
            Err(refusal) => rule(refusal),
        };
        self.note(result);
        self.outcomes.push(outcome);
    }

    /// Writes the report (counters, then the `report` entry), ignoring
    /// refusals; or returns the first refusal when the event asks for it.
    fn finish(self, params: &Params) -> Result<(), HandlerError> {
        if params.then == "return"
            && let Some(first) = self.first.values().next()
        {
            return Err(error(class(&params.class), first.clone()));
        }
        let attack = self.attack;
        if self.accepted > 0 {
            let _ = state::counter_add(&format!("{attack}.accepted"), self.accepted as i64);
        }
        for (rule, count) in &self.refused {
            let _ = state::counter_add(&format!("{attack}.refused.{rule}"), *count as i64);
        }
        let report = serde_json::json!({
            "accepted": self.accepted,
            "refused": self.refused,
            "first": self.first,
            "outcomes": self.outcomes,
        });
        let _ = state::set("report", report.to_string().as_bytes());
        Ok(())
    }
}

/// The step count of a flood: `n`, or practically unbounded for 0.
fn flood_steps(params: &Params) -> u64 {
    if params.n == 0 { u64::MAX } else { params.n }
}

fn size_or(params: &Params, default: u64) -> usize {
    (if params.size == 0 { default } else { params.size }) as usize
}

/// Tries every state and emit import outside `handle`; traps if the host
/// accepts any of them.
fn outside_handle(export: &str) {
    let attempts: [(&str, bool); 6] = [
        ("state.get", state::get("x").is_ok()),
        ("state.set", state::set("x", b"1").is_ok()),
        ("state.delete", state::delete("x").is_ok()),
        ("state.counter-add", state::counter_add("x", 1).is_ok()),
        ("state.counter-get", state::counter_get("x").is_ok()),
        ("emit.emit", emit::emit(&outgoing(OUT, int_key(1), b"x".to_vec())).is_ok()),
    ];
    for (import, accepted) in attempts {
        if accepted {
            panic!("the host accepted `{import}` during `{export}`");
        }
    }
}

/// A name `len` bytes long (at least 65) that hashes, under the host's
/// FxHash (rustc-hash 2, 64-bit), to the same value as every other name
/// this function makes; `index` tells them apart.
///
/// rustc-hash 2 hashes a string longer than 16 bytes in 16-byte chunks
/// `(x, y)`, each step `t = mix(s0 ^ x, C ^ y)` where `mix(0, _) = 0`.
/// The third chunk's `x` is set to the state it meets, so that step yields
/// 0 whatever its `y`, and `y` (8 bytes outside the final 16) is free.
pub fn colliding_name(index: u64, len: usize) -> String {
    assert!(len >= 65, "a colliding name has at least 65 bytes");
    let first = first_chunk();
    let mut name = first.to_vec();
    name.extend_from_slice(b"--collide-the-fx"); // chunk 2 (bytes 16..32)
    name.extend_from_slice(&fx_step(FX_SEED1, &first).to_le_bytes()); // chunk 3's x
    name.extend_from_slice(&printable(index)); // chunk 3's y: free
    name.resize(len, b'.');
    String::from_utf8(name).expect("printable ASCII")
}

/// A name of the same length as [`colliding_name`] that does not collide.
pub fn plain_name(index: u64, len: usize) -> String {
    let mut name = format!("plain-{index:016}-").into_bytes();
    name.resize(len, b'.');
    String::from_utf8(name).expect("ASCII")
}

const FX_SEED1: u64 = 0x243f_6a88_85a3_08d3;
const FX_PREVENT_TRIVIAL_ZERO_COLLAPSE: u64 = 0xa409_3822_299f_31d0;

/// rustc-hash 2's `multiply_mix` on 64-bit hosts.
fn fx_mix(x: u64, y: u64) -> u64 {
    let full = u128::from(x) * u128::from(y);
    (full as u64) ^ ((full >> 64) as u64)
}

/// One bulk step of rustc-hash 2's `hash_bytes` for state `s0` and chunk.
fn fx_step(s0: u64, chunk: &[u8; 16]) -> u64 {
    let x = u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes"));
    let y = u64::from_le_bytes(chunk[8..].try_into().expect("8 bytes"));
    fx_mix(s0 ^ x, FX_PREVENT_TRIVIAL_ZERO_COLLAPSE ^ y)
}

/// A printable first chunk whose step output is printable ASCII too, so
/// the third chunk can repeat it inside a UTF-8 name.
fn first_chunk() -> [u8; 16] {
    (0u64..)
        .map(|i| {
            let mut chunk = *b"hostile-names---";
            chunk[8..].copy_from_slice(&printable(i));
            chunk
        })
        .find(|chunk| fx_step(FX_SEED1, chunk).to_le_bytes().iter().all(|b| (0x20..0x7f).contains(b)))
        .expect("about one chunk in 3 000 qualifies")
}

/// `index` as 8 printable characters.
fn printable(mut index: u64) -> [u8; 8] {
    const DIGITS: &[u8; 64] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+_";
    let mut out = [b'0'; 8];
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(index % 64) as usize];
        index /= 64;
    }
    out
}

/// The size of the allocation the armed allocator misbehaves on: the
/// host asks `cabi_realloc` for exactly this many bytes to lower a body of
/// this size (align 1), or the list of 1001 bodies (8 bytes each, align 4).
pub const ALLOC_TRIGGER: usize = 8008;

/// What the armed allocator does (0: nothing, it is not armed).
static ARMED: AtomicU32 = AtomicU32::new(0);

/// The ways [`HostileAlloc`] misbehaves, by the `mode` of `ArmAllocator`.
const ALLOC_MODES: [&str; 6] = ["trap", "loop", "out-of-bounds", "misaligned", "grow", "post-return"];

/// The allocator behind `cabi_realloc` (wit-bindgen's `cabi_realloc`
/// calls the global allocator), which the host calls to place a call's
/// key and bodies in this module's memory. Armed by `ArmAllocator`, it
/// misbehaves once, on the next allocation of [`ALLOC_TRIGGER`] bytes:
/// `trap` traps, `loop` spins forever, `out-of-bounds` answers a pointer
/// past the end of memory, `misaligned` one off the alignment asked for,
/// `grow` grows memory by 4 GiB first; `post-return` traps when such a
/// block is freed (by the post-return function, after the host read the
/// call's result). Otherwise it is the system allocator. Only in the
/// component: a native build of this crate (clippy, tests) keeps the
/// system allocator.
#[cfg(target_arch = "wasm32")]
struct HostileAlloc;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: HostileAlloc = HostileAlloc;

#[cfg(target_arch = "wasm32")]
impl HostileAlloc {
    /// The armed mode, disarmed, when `layout` is the trigger.
    fn fire(layout: Layout, modes: &[&str]) -> Option<&'static str> {
        if layout.size() != ALLOC_TRIGGER {
            return None;
        }
        let armed = ARMED.load(Ordering::Relaxed) as usize;
        let mode = *ALLOC_MODES.get(armed.checked_sub(1)?)?;
        modes.contains(&mode).then(|| {
            ARMED.store(0, Ordering::Relaxed);
            mode
        })
    }
}

// SAFETY: every mode either never returns, returns memory from `System`
// as `System` would, or returns a pointer that is wrong on purpose (the
// attack) to the host, which is the only caller of an allocation of
// exactly `ALLOC_TRIGGER` bytes once armed; this module never uses it.
#[cfg(target_arch = "wasm32")]
unsafe impl GlobalAlloc for HostileAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Self::fire(layout, &ALLOC_MODES[..5]) {
            Some("trap") => core::arch::wasm32::unreachable(),
            Some("loop") => loop {
                std::hint::black_box(&layout);
            },
            Some("out-of-bounds") => (core::arch::wasm32::memory_size::<0>() * 65536 - 16) as *mut u8,
            Some("misaligned") => {
                // SAFETY: a valid layout, bigger than the one asked for.
                let block = unsafe { System.alloc(Layout::from_size_align_unchecked(layout.size() + 8, 8)) };
                block.wrapping_add(1)
            }
            Some(_) => {
                core::arch::wasm32::memory_grow::<0>(65536);
                // SAFETY: as asked.
                unsafe { System.alloc(layout) }
            }
            // SAFETY: as asked.
            None => unsafe { System.alloc(layout) },
        }
    }

    // `realloc` is the trait's default: `alloc`, copy, `dealloc`, so a
    // block grown to the trigger size misbehaves too.

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if Self::fire(layout, &["post-return"]).is_some() {
            core::arch::wasm32::unreachable();
        }
        // SAFETY: as asked.
        unsafe { System.dealloc(ptr, layout) }
    }
}

struct Hostile;

impl Guest for Hostile {
    fn describe() -> ModuleInfo {
        misbehave("describe");
        outside_handle("describe");
        ModuleInfo {
            event_types: ATTACKS
                .iter()
                .map(|&(tag, name, algebra, max_batch)| EventType { tag, name: name.to_owned(), algebra, max_batch })
                .collect(),
            emits: vec![OUT.to_owned()],
        }
    }

    /// The integer key of the body, except for `BadKeyExport`, whose
    /// `mode` picks what comes back: `non-canonical` (an integer not in
    /// its shortest form), `long` (a 2 KiB byte string), `empty`,
    /// `trailing` (a byte after the value), `max` (a 1024-byte key: the
    /// limit, valid), `escape` (a valid string key of [`ESCAPES`]), or an
    /// error for anything else.
    fn key(tag: u32, body: Vec<u8>) -> Result<Vec<u8>, HandlerError> {
        misbehave("key");
        outside_handle("key");
        let params = parse_params(&body)?;
        if attack(tag) != Some("BadKeyExport") {
            return Ok(int_key(i128::from(params.key)));
        }
        Ok(match params.mode.as_str() {
            "non-canonical" => vec![0x01, 0x80, 0x00],
            "long" => bytes_key(2048),
            "empty" => Vec::new(),
            "trailing" => [int_key(i128::from(params.key)), vec![0x00]].concat(),
            "max" => bytes_key(1024),
            "escape" => string_key(ESCAPES),
            other => return Err(error(ErrorClass::Unrecoverable, format!("no key mode `{other}`"))),
        })
    }

    fn ordering(_tag: u32, body: Vec<u8>) -> Result<MessageOrdering, HandlerError> {
        misbehave("ordering");
        outside_handle("ordering");
        parse_params(&body)?;
        Ok(MessageOrdering::Relaxed)
    }

    /// `HugeCombine` folds a run into a body of `size` bytes (default
    /// 2 MiB; `mode` `empty`: no bytes at all; `fail`: of `!`, which
    /// `handle` then fails as unrecoverable; `panic`, `loop`, `exit`:
    /// panics, spins forever, or exits the process with status 3).
    fn combine(tag: u32, bodies: Vec<Vec<u8>>) -> Result<Vec<u8>, HandlerError> {
        misbehave("combine");
        outside_handle("combine");
        let first = bodies.first().ok_or_else(|| error(ErrorClass::Unrecoverable, "nothing to fold".to_owned()))?;
        // A body this function folded before (the host folds a long run
        // in parts, then the parts): folding it again changes nothing.
        let Ok(params) = parse_params(first) else { return Ok(first.clone()) };
        if attack(tag) != Some("HugeCombine") {
            return Err(error(ErrorClass::Unrecoverable, format!("tag {tag} does not fold")));
        }
        match params.mode.as_str() {
            "empty" => Ok(Vec::new()),
            "fail" => Ok(vec![b'!'; size_or(&params, 2 << 20)]),
            "panic" => panic!("hostile combine panics"),
            "loop" => loop {
                std::hint::black_box(&bodies);
            },
            "exit" => std::process::exit(3),
            _ => Ok(vec![b' '; size_or(&params, 2 << 20)]),
        }
    }

    fn handle(tag: u32, key: Vec<u8>, bodies: Vec<Vec<u8>>) -> Result<(), HandlerError> {
        misbehave("handle");
        let Some(attack) = attack(tag) else {
            return Err(error(ErrorClass::Unrecoverable, format!("tag {tag} is no attack")));
        };
        let Some(first) = bodies.first() else { return Ok(()) };
        // `HugeCombine` receives the folded body, which is not JSON.
        if attack == "HugeCombine" && first.first() == Some(&b'!') {
            return Err(error(ErrorClass::Unrecoverable, "the folded body fails".to_owned()));
        }
        let params = if attack == "HugeCombine" { Params::default() } else { parse_params(first)? };
        let mut report = Report::new(attack);
        match attack {
            "EmitUndeclared" => {
                let topic = if params.topic.is_empty() { "nowhere" } else { params.topic.as_str() };
                report.step(emit::emit(&outgoing(topic, key, b"x".to_vec())));
            }
            "EmitHostTopic" => {
                let mut topics = vec![format!("dlq_{OUT}"), format!("retry_{OUT}")];
                if !params.topic.is_empty() {
                    topics.extend([format!("dlq_{}", params.topic), format!("retry_{}", params.topic)]);
                }
                for topic in topics {
                    report.step(emit::emit(&outgoing(&topic, key.clone(), b"x".to_vec())));
                }
            }
            "EmitBadTopic" => {
                let huge = "t".repeat(size_or(&params, 1 << 20));
                let long = "t".repeat(256);
                let bad = ["", "a/b", "../hostile_out", "hostile out", "naïve", "HOSTILE_OUT", "hostile_out\0"];
                for topic in bad.into_iter().chain([long.as_str(), huge.as_str()]) {
                    report.step(emit::emit(&outgoing(topic, key.clone(), b"x".to_vec())));
                }
            }
            "EmitBadBody" => {
                // An empty body, then one of `size` bytes (the test passes
                // one over the host's limit).
                report.step(emit::emit(&outgoing(OUT, key.clone(), Vec::new())));
                if params.size > 0 {
                    report.step(emit::emit(&outgoing(OUT, key, vec![b'b'; params.size as usize])));
                }
            }
            "EmitBadKey" => {
                let deep = [[0x04, 0x01].repeat(17), int_key(1)].concat();
                let keys: Vec<Vec<u8>> = vec![
                    Vec::new(),                                        // empty
                    vec![0x01, 0x80, 0x00],                            // not the shortest form
                    vec![0x01, 0x02, 0x00],                            // a byte after the value
                    vec![0x07, 0x00],                                  // no such value tag
                    vec![0x01],                                        // ends inside the value
                    vec![0x02, 0x02, 0xff, 0xfe],                      // a string that is not UTF-8
                    [vec![0x01], vec![0xff; 19], vec![0x7f]].concat(), // past u64::MAX
                    deep,                                              // 17 tuples deep
                    bytes_key(1025),                                   // one byte over the limit
                    bytes_key(2048),                                   // 2 KiB
                    bytes_key(1024),                                   // the limit: accepted
                ];
                for bad in keys {
                    report.step(emit::emit(&outgoing(OUT, bad, b"x".to_vec())));
                }
            }
            "EmitFlood" => {
                let body = vec![b'e'; size_or(&params, 1)];
                for _ in 0..flood_steps(&params) {
                    if !report.note(emit::emit(&outgoing(OUT, key.clone(), body.clone()))) {
                        break;
                    }
                }
            }
            "SetFlood" => {
                let value = vec![b's'; size_or(&params, 1)];
                for i in 0..flood_steps(&params) {
                    if !report.note(state::set(&format!("flood.{}.{i}", params.seq), &value)) {
                        break;
                    }
                }
            }
            "BigValues" => {
                // Values of `size` bytes (default: 1 MiB, the default
                // limit) until refused.
                let value = vec![b'v'; size_or(&params, 1 << 20)];
                for i in 0..flood_steps(&params) {
                    if !report.note(state::set(&format!("big.{}.{i}", params.seq), &value)) {
                        break;
                    }
                }
            }
            "DeleteFlood" => {
                for i in 0..flood_steps(&params) {
                    if !report.note(state::delete(&format!("gone.{}.{i}", params.seq))) {
                        break;
                    }
                }
            }
            "CounterNames" => {
                for i in 0..flood_steps(&params) {
                    if !report.note(state::counter_add(&format!("many.{}.{i}", params.seq), 1)) {
                        break;
                    }
                }
            }
            "CounterOverflow" => {
                // `max3`: i64::MAX three times. `min`: i64::MIN, -1,
                // i64::MAX, i64::MIN, 1. Then a read.
                let name = if params.name.is_empty() { "overflow" } else { params.name.as_str() };
                let deltas: &[i64] = match params.mode.as_str() {
                    "min" => &[i64::MIN, -1, i64::MAX, i64::MIN, 1],
                    _ => &[i64::MAX, i64::MAX, i64::MAX],
                };
                for &delta in deltas {
                    report.step(state::counter_add(name, delta));
                }
                read_counter(&mut report, name);
            }
            "SharedCounter" => {
                let name = if params.name.is_empty() { "shared" } else { params.name.as_str() };
                report.step(state::counter_add(name, params.delta));
                read_counter(&mut report, name);
            }
            "BadNames" if !params.name.is_empty() => {
                // The name the test gives (a NUL, say), on every import.
                let name = params.name.as_str();
                report.step(state::get(name).map(|_| ()));
                report.step(state::set(name, b"v"));
                report.step(state::delete(name));
                report.step(state::counter_add(name, 1));
                report.step(state::counter_get(name).map(|_| ()));
            }
            "BadNames" => {
                let huge = "n".repeat(size_or(&params, 1 << 20));
                let long = "n".repeat(257);
                for name in ["", long.as_str(), huge.as_str()] {
                    report.step(state::get(name).map(|_| ()));
                    report.step(state::set(name, b"v"));
                    report.step(state::delete(name));
                    report.step(state::counter_add(name, 1));
                    report.step(state::counter_get(name).map(|_| ()));
                }
                // The limit itself is a name.
                report.step(state::set(&"n".repeat(256), b"v"));
            }
            "LogFlood" => {
                let line = match params.mode.as_str() {
                    "escape" => ESCAPES.to_owned(),
                    "text" => params.name.clone(),
                    _ => "l".repeat(size_or(&params, 1 << 20)),
                };
                let levels =
                    [log::Level::Trace, log::Level::Debug, log::Level::Info, log::Level::Warn, log::Level::Error];
                for i in 0..params.n.max(1) {
                    log::log(levels[(i % 5) as usize], &line);
                }
                report.accepted = params.n.max(1);
            }
            "HugeError" => {
                let message = match params.mode.as_str() {
                    "escape" => ESCAPES.to_owned(),
                    _ => "E".repeat(size_or(&params, 8 << 20)),
                };
                return Err(error(class(&params.class), message));
            }
            "Sleep" => {
                // Waits `n` seconds (default an hour; `mode` `forever`:
                // u64::MAX nanoseconds, the longest one subscription to
                // the clock asks for) through WASI's clock, outside the
                // reach of the CPU budget, which only interrupts running
                // wasm code.
                let duration = match params.mode.as_str() {
                    "forever" => std::time::Duration::from_nanos(u64::MAX),
                    _ => std::time::Duration::from_secs(if params.n == 0 { 3600 } else { params.n }),
                };
                std::thread::sleep(duration);
                report.outcomes.push("woke".to_owned());
            }
            "Exit" => {
                // Exits the process (WASI `exit`) with status `n`, halfway
                // through a write.
                report.step(state::set("before-exit", b"1"));
                std::process::exit(params.n as i32);
            }
            "Random" => {
                // Asks WASI for `size` random bytes (`mode` `insecure`:
                // through `wasi:random/insecure`): the host makes them. The outcome
                // names how many came and the first 8 in hex.
                let bytes = match params.mode.as_str() {
                    "insecure" => wasip2::random::insecure::get_insecure_random_bytes(params.size),
                    _ => wasip2::random::random::get_random_bytes(params.size),
                };
                let first: String = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
                report.outcomes.push(format!("{} bytes {first}", bytes.len()));
            }
            "Handles" => {
                // Opens `n` WASI handles (`mode` `streams`: stderr output
                // streams; otherwise clock pollables), each one a resource
                // the host keeps in its tables; with `leak`, never drops
                // them.
                let mut handles: Vec<Box<dyn std::any::Any>> = Vec::new();
                for _ in 0..flood_steps(&params) {
                    handles.push(match params.mode.as_str() {
                        "streams" => Box::new(wasip2::cli::stderr::get_stderr()),
                        _ => Box::new(wasip2::clocks::monotonic_clock::subscribe_duration(0)),
                    });
                }
                report.outcomes.push(format!("{} handles", handles.len()));
                if params.leak {
                    std::mem::forget(handles);
                }
            }
            "Transient" => {
                return Err(error(ErrorClass::Transient, format!("transient, key {}", params.key)));
            }
            "ArmAllocator" => {
                let Some(index) = ALLOC_MODES.iter().position(|mode| *mode == params.mode) else {
                    return Err(error(ErrorClass::Unrecoverable, format!("no allocator mode `{}`", params.mode)));
                };
                ARMED.store(index as u32 + 1, Ordering::Relaxed);
                if params.mode == "post-return" {
                    // The post-return function frees this message.
                    return Err(error(ErrorClass::Unrecoverable, "m".repeat(ALLOC_TRIGGER)));
                }
                return Ok(());
            }
            // The `escape` key fails its call with [`ESCAPES`], so the key
            // and the message reach the host's warning and dead letter.
            "BadKeyExport" if params.mode == "escape" => {
                return Err(error(class(&params.class), ESCAPES.to_owned()));
            }
            "BadKeyExport" => {}
            "HugeCombine" => {
                report.outcomes.push(format!("{} bodies, the first of {} bytes", bodies.len(), first.len()));
            }
            "RefusalSpin" => {
                // Refused calls, ignored, `n` times (0: until the CPU
                // budget ends the call).
                for _ in 0..flood_steps(&params) {
                    let _ = std::hint::black_box(emit::emit(&outgoing("nowhere", key.clone(), b"x".to_vec())));
                    let _ = std::hint::black_box(state::set("", b"v"));
                }
                report.accepted = params.n;
            }
            "NotUtf8" => {
                // Bytes that are not UTF-8 where the contract says string:
                // a raw component can put anything there.
                let bytes = std::hint::black_box(vec![0xff_u8, 0xfe, b'x']);
                // SAFETY: not safe at all: this hands the host a `string`
                // that is not UTF-8, which is the attack. Nothing in this
                // module reads the `&str` itself.
                let text = unsafe { std::str::from_utf8_unchecked(&bytes) };
                match params.mode.as_str() {
                    "topic" => report.step(emit::emit(&outgoing(text, key, b"x".to_vec()))),
                    "log" => log::log(log::Level::Info, text),
                    _ => report.step(state::set(text, b"v")),
                }
            }
            "Behave" => {
                // The key the host passes must be the one this module
                // gives the body.
                for body in &bodies {
                    let expected = int_key(i128::from(parse_params(body)?.key));
                    if key != expected {
                        return Err(error(
                            ErrorClass::Unrecoverable,
                            format!("the host passed key {key:?} for a body of key {expected:?}"),
                        ));
                    }
                }
                report.step(state::set("seen", &key));
                report.step(state::counter_add("behaved", bodies.len() as i64));
                if params.mode == "emit" {
                    for body in &bodies {
                        report.step(emit::emit(&outgoing(OUT, key.clone(), body.clone())));
                    }
                }
            }
            "CollidingNames" | "CollidingCounters" => {
                let len = size_or(&params, 65).max(65);
                let base = params.seq.saturating_mul(1 << 20);
                for i in 0..flood_steps(&params) {
                    let name = match params.mode.as_str() {
                        "plain" => plain_name(base + i, len),
                        _ => colliding_name(base + i, len),
                    };
                    let result = match attack {
                        "CollidingNames" => state::set(&name, b"c"),
                        _ => state::counter_add(&name, 1),
                    };
                    if !report.note(result) {
                        break;
                    }
                }
            }
            other => return Err(error(ErrorClass::Unrecoverable, format!("attack `{other}` has no handler"))),
        }
        report.finish(&params)
    }
}

/// Reads a counter and lists `= <value>` or the rule the read broke.
fn read_counter(report: &mut Report, name: &str) {
    match state::counter_get(name) {
        Ok(value) => {
            report.accepted += 1;
            report.outcomes.push(format!("= {value}"));
        }
        Err(refusal) => {
            report.outcomes.push(rule(&refusal));
            report.note::<()>(Err(refusal));
        }
    }
}

bindings::export!(Hostile with_types_in bindings);
