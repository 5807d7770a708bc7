//! A handler module for the host's own tests. Each event type asks it to do
//! one thing, well or badly, so tests can check what the sandbox and the
//! consumer do about it: spin, hog memory, leak memory, panic, note (state, counter,
//! log, emit), fail by class, recurse, chatter on stderr, peek at its
//! surroundings, keep a ledger that fails on cue, note the order timed
//! events of several types reach it in, or call an import raw, many times,
//! with values the SDK would never send.
//!
//! It declares that it emits to `notes-out` and `out`. Built with the
//! feature `untimed-ledger`, it is the same module but for one thing:
//! `TimedLedger` declares no event time (a type that stops, or starts,
//! declaring it between two versions).

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{
    Context, ErrorClass, Event, EventAtomicOrdering, EventTiming, EventTypeTag, Handler, HandlerError, PartitionKey,
};

/// Every probe event is keyed by a plain number.
#[derive(Serialize)]
pub struct ProbeKey(pub u64);

impl PartitionKey for ProbeKey {}

macro_rules! probe_event {
    ($name:ident, $tag:expr, { $($field:ident: $ty:ty),* }) => {
        #[doc = concat!("Probe event `", stringify!($name), "`.")]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub struct $name {
            /// The key.
            pub key: u64,
            $(#[allow(missing_docs)] pub $field: $ty,)*
        }

        impl Event for $name {
            const TYPE_TAG: EventTypeTag = EventTypeTag::new($tag);
            const NAME: &'static str = stringify!($name);
            type Key = ProbeKey;

            fn key(&self) -> ProbeKey {
                ProbeKey(self.key)
            }
        }
    };
}

probe_event!(Spin, 1, {});
probe_event!(Hog, 2, { mib: u64 });
probe_event!(Panic, 3, { message: String });
probe_event!(Note, 4, { text: String, emit_to: Option<String> });
probe_event!(Fail, 5, { class: String, message: String });
probe_event!(Recurse, 6, { depth: u64 });
probe_event!(Peek, 7, {});
probe_event!(Leak, 9, { kib: u64 });
probe_event!(Chatter, 40, { lines: u64 });
probe_event!(Raw, 8, {
    op: String,
    name: String,
    len: u64,
    delta: i64,
    topic: String,
    emit_key: Vec<u8>,
    count: u64,
    ignore: bool
});

/// A ledger entry for the crash test: `amount` is added to the key's
/// `balance`, unless `fail` names a failure to cause instead
/// (`"transient"`, `"retryable"`, `"unrecoverable"` or `"trap"`). `seq`
/// rises per key in publication order; a handler that sees it fall counts
/// `out_of_order`. One event per call, so a failure fails only its own event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ledger {
    /// The key.
    pub key: u64,
    /// Publication order within the key.
    pub seq: u64,
    /// Added to the balance.
    pub amount: i64,
    /// A failure to cause instead.
    pub fail: Option<String>,
    /// `relaxed`, `acquire`, `release` or `acq-rel`.
    pub ordering: String,
}

impl Event for Ledger {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(50);
    const NAME: &'static str = "Ledger";
    const MAX_BATCH: u32 = 1;
    type Key = ProbeKey;

    fn key(&self) -> ProbeKey {
        ProbeKey(self.key)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        match self.ordering.as_str() {
            "acquire" => EventAtomicOrdering::Acquire,
            "release" => EventAtomicOrdering::Release,
            "acq-rel" => EventAtomicOrdering::AcqRel,
            _ => EventAtomicOrdering::Relaxed,
        }
    }
}

/// The probe module.
pub struct Probe;

/// The ledger entry of a timed type: applied by the ledger's handler, in
/// event-time order across a projection's topics. Its event time is `at`
/// when the body has it (`None` breaks the declaration); the tests that
/// stamp `waku-event-time` themselves leave it out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimedLedger {
    /// The entry.
    #[serde(flatten)]
    pub entry: Ledger,
    /// Its event time.
    #[serde(default)]
    pub at: Option<i64>,
}

impl Event for TimedLedger {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(51);
    const NAME: &'static str = "TimedLedger";
    const MAX_BATCH: u32 = 1;
    // Built with `untimed-ledger`, the type declares no event time.
    const TIMING: EventTiming =
        if cfg!(feature = "untimed-ledger") { EventTiming::Untimed } else { EventTiming::Timed };
    type Key = ProbeKey;

    fn key(&self) -> ProbeKey {
        self.entry.key()
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        self.entry.atomic_ordering()
    }

    fn event_time(&self) -> Option<i64> {
        self.at.filter(|_| !cfg!(feature = "untimed-ledger"))
    }
}

impl Handler<TimedLedger> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[TimedLedger]) -> Result<(), HandlerError> {
        apply_ledger(ctx, events.iter().map(|timed| &timed.entry))
    }
}

impl Handler<Ledger> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Ledger]) -> Result<(), HandlerError> {
        apply_ledger(ctx, events)
    }
}

/// Applies ledger entries (see [`Ledger`]).
fn apply_ledger<'a>(ctx: &mut Context<'_>, events: impl IntoIterator<Item = &'a Ledger>) -> Result<(), HandlerError> {
    for entry in events {
        let class = match entry.fail.as_deref() {
            None => None,
            Some("trap") => panic!("ledger entry {} of key {} traps", entry.seq, entry.key),
            Some("transient") => Some(ErrorClass::Transient),
            Some("retryable") => Some(ErrorClass::Retryable),
            Some(_) => Some(ErrorClass::Unrecoverable),
        };
        if let Some(class) = class {
            return Err(HandlerError::new(class, format!("ledger entry {} of key {}", entry.seq, entry.key)));
        }
        if ctx.get::<u64>("seq")?.is_some_and(|last| last >= entry.seq) {
            ctx.counter_add("out_of_order", 1)?;
        }
        ctx.set("seq", &entry.seq)?;
        let balance = ctx.get::<i64>("balance")?.unwrap_or(0);
        ctx.set("balance", &(balance + entry.amount))?;
        ctx.counter_add("ledger", 1)?;
    }
    Ok(())
}

/// Events of four timed types of one product, each `{"key", "at"}`: the
/// handler appends `<letter>@<at>` to the key's `seen` (a JSON list), so a
/// test reads the order the handler saw them in. `Ordered` and `Shipped`
/// are `Timed` (their events reach the handler in event-time order);
/// `Returned` and `Inspected` are `TimedRelaxed` (each type's events form
/// one run). All four are relaxed.
macro_rules! seen_event {
    ($name:ident, $tag:expr, $timing:expr) => {
        #[doc = concat!("Timed probe event `", stringify!($name), "` (see `seen_event!`).")]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub struct $name {
            /// The key.
            pub key: u64,
            /// Its event time.
            pub at: i64,
        }

        impl Event for $name {
            const TYPE_TAG: EventTypeTag = EventTypeTag::new($tag);
            const NAME: &'static str = stringify!($name);
            const TIMING: EventTiming = $timing;
            type Key = ProbeKey;

            fn key(&self) -> ProbeKey {
                ProbeKey(self.key)
            }

            fn event_time(&self) -> Option<i64> {
                Some(self.at)
            }
        }

        impl Handler<$name> for Probe {
            fn handle(ctx: &mut Context<'_>, events: &[$name]) -> Result<(), HandlerError> {
                let mut seen: Vec<String> = ctx.get("seen")?.unwrap_or_default();
                seen.extend(events.iter().map(|e| format!("{}@{}", &stringify!($name)[..1], e.at)));
                ctx.set("seen", &seen)
            }
        }
    };
}

seen_event!(Ordered, 52, EventTiming::Timed);
seen_event!(Shipped, 53, EventTiming::Timed);
seen_event!(Returned, 54, EventTiming::TimedRelaxed);
seen_event!(Inspected, 55, EventTiming::TimedRelaxed);

impl Handler<Spin> for Probe {
    fn handle(_: &mut Context<'_>, _: &[Spin]) -> Result<(), HandlerError> {
        let mut counter = 0u64;
        loop {
            counter = std::hint::black_box(counter.wrapping_add(1));
        }
    }
}

impl Handler<Hog> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Hog]) -> Result<(), HandlerError> {
        let mut kept = Vec::new();
        for event in events {
            for _ in 0..event.mib {
                kept.push(std::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
        ctx.set("hogged", &kept.len())
    }
}

/// Leaks `kib` KiB per event and counts the calls in `leaks`: an instance
/// whose memory only grows, as a garbage-collected heap's does between
/// collections.
impl Handler<Leak> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Leak]) -> Result<(), HandlerError> {
        for event in events {
            std::mem::forget(std::hint::black_box(vec![1u8; event.kib as usize * 1024]));
        }
        ctx.counter_add("leaks", 1)
    }
}

impl Handler<Panic> for Probe {
    fn handle(_: &mut Context<'_>, events: &[Panic]) -> Result<(), HandlerError> {
        panic!("{}", events[0].message);
    }
}

impl Handler<Note> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Note]) -> Result<(), HandlerError> {
        for note in events {
            ctx.set("last", &note.text)?;
            ctx.counter_add("notes", 1)?;
            ctx.info(&format!("noted {}", note.text));
            if let Some(topic) = &note.emit_to {
                ctx.emit(topic, &Note { emit_to: None, ..note.clone() })?;
            }
        }
        Ok(())
    }
}

impl Handler<Fail> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Fail]) -> Result<(), HandlerError> {
        // Written, then failed: the host must drop this write.
        ctx.set("before-failure", &true)?;
        let event = &events[0];
        let class = match event.class.as_str() {
            "transient" => ErrorClass::Transient,
            "retryable" => ErrorClass::Retryable,
            _ => ErrorClass::Unrecoverable,
        };
        Err(HandlerError::new(class, event.message.clone()))
    }
}

impl Handler<Recurse> for Probe {
    fn handle(_: &mut Context<'_>, events: &[Recurse]) -> Result<(), HandlerError> {
        fn down(depth: u64) -> u64 {
            if depth == 0 { 0 } else { std::hint::black_box(down(depth - 1)) + 1 }
        }
        down(events[0].depth);
        Ok(())
    }
}

impl Handler<Chatter> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Chatter]) -> Result<(), HandlerError> {
        for line in 0..events[0].lines {
            eprintln!("chatter line {line}: a guest that prints a lot to stderr");
        }
        ctx.set("chattered", &events[0].lines)
    }
}

/// Looks around the sandbox: environment, arguments, clocks, files and the
/// network. Writes what it saw to the state entry `surroundings`, a JSON
/// object with `env_vars` and `args` (counts), `wall_clock_secs` (seconds
/// since the Unix epoch), `monotonic_nanos` (how far the monotonic clock
/// moved across a busy loop), and `read_root`, `open_file`, `tcp_connect`,
/// `name_lookup` (each `{"Ok": …}` or `{"Err": "<error>"}`).
impl Handler<Peek> for Probe {
    fn handle(ctx: &mut Context<'_>, _: &[Peek]) -> Result<(), HandlerError> {
        use std::net::ToSocketAddrs;
        use std::time::{Instant, SystemTime, UNIX_EPOCH};

        let error = |e: std::io::Error| e.to_string();
        let started = Instant::now();
        let mut spun = 0u64;
        for i in 0..1_000_000u64 {
            spun = std::hint::black_box(spun.wrapping_add(i));
        }
        let surroundings = serde_json::json!({
            "env_vars": std::env::vars_os().count(),
            "args": std::env::args_os().count(),
            "wall_clock_secs": SystemTime::now().duration_since(UNIX_EPOCH).map_or(u64::MAX, |d| d.as_secs()),
            "monotonic_nanos": started.elapsed().as_nanos() as u64,
            "read_root": std::fs::read_dir("/").map(|entries| entries.count()).map_err(error),
            "open_file": std::fs::read("/etc/passwd").map(|bytes| bytes.len()).map_err(error),
            "tcp_connect": std::net::TcpStream::connect(("127.0.0.1", 9)).map(|_| ()).map_err(error),
            "name_lookup": ("localhost", 80).to_socket_addrs().map(|addrs| addrs.count()).map_err(error),
        });
        ctx.set("surroundings", &surroundings)
    }
}

/// Calls one import `count` times straight through the WIT bindings,
/// bypassing the SDK: `op` is `get`, `set` (a value of `len` bytes),
/// `delete`, `counter-add` (`delta`), `counter-get`, `emit` (to `topic`,
/// key bytes `emit_key` as given, a body of `len` bytes), `log` (a line
/// of `len` bytes), `timer-set` (timer `name` at `delta`, a payload of
/// `len` bytes) or `timer-cancel`, or `key` (writes the key being handled, in its text
/// form, to the entry `key`, through the SDK). `{i}` in `name` becomes the
/// call's index. The first
/// refusal fails the call (unrecoverable, "`n` accepted, then refused:
/// <refusal>"), unless `ignore` is set: then every call is made, and the
/// call succeeds whatever was refused.
impl Handler<Raw> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Raw]) -> Result<(), HandlerError> {
        use wakuwaku_guest::bindings::wakuwaku::handler::{emit, log, state, timers, types};
        for raw in events {
            if raw.op == "key" {
                let key = ctx.key().to_string();
                ctx.set("key", &key)?;
                continue;
            }
            let mut accepted = 0u64;
            for i in 0..raw.count {
                let name = raw.name.replace("{i}", &i.to_string());
                let bytes = vec![b'r'; raw.len as usize];
                let result = match raw.op.as_str() {
                    "get" => state::get(&name).map(drop),
                    "set" => state::set(&name, &bytes),
                    "delete" => state::delete(&name),
                    "counter-add" => state::counter_add(&name, raw.delta),
                    "counter-get" => state::counter_get(&name).map(drop),
                    "emit" => emit::emit(&types::Outgoing {
                        topic: raw.topic.clone(),
                        tag: Note::TYPE_TAG.get(),
                        key: raw.emit_key.clone(),
                        ordering: types::Ordering::Relaxed,
                        algebra: types::Algebra::NonAssociative,
                        body: bytes,
                    }),
                    "log" => {
                        log::log(log::Level::Info, &String::from_utf8(bytes).unwrap_or_default());
                        Ok(())
                    }
                    "timer-set" => timers::set(&name, raw.delta, &bytes),
                    "timer-cancel" => timers::cancel(&name),
                    other => return Err(HandlerError::unrecoverable(format!("unknown raw op `{other}`"))),
                };
                match result {
                    Ok(()) => accepted += 1,
                    Err(refusal) if !raw.ignore => {
                        return Err(HandlerError::unrecoverable(format!(
                            "{accepted} accepted, then refused: {refusal}"
                        )));
                    }
                    Err(_) => {}
                }
            }
        }
        Ok(())
    }
}

/// A timed event for the timer tests: appends `e<at>` to the key's entry
/// `seq` (a JSON list) and, when `timer` is given, sets the timer
/// `tick-<timer>` at that time (its firing appends `t<at>`, see
/// [`Probe::fire`](wakuwaku_guest::OnTimers::fire)). One event per call,
/// so a timer's place between two events is exact.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tick {
    /// The key.
    pub key: u64,
    /// Its event time.
    pub at: i64,
    /// A timer to set.
    pub timer: Option<i64>,
    /// Its name, if not `tick-<timer>`; one starting `fail` fails the
    /// `fire` call it is handed to (unrecoverable).
    #[serde(default)]
    pub name: Option<String>,
}

impl Event for Tick {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(70);
    const NAME: &'static str = "Tick";
    const MAX_BATCH: u32 = 1;
    const TIMING: EventTiming = EventTiming::Timed;
    type Key = ProbeKey;

    fn key(&self) -> ProbeKey {
        ProbeKey(self.key)
    }

    fn event_time(&self) -> Option<i64> {
        Some(self.at)
    }
}

impl Handler<Tick> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Tick]) -> Result<(), HandlerError> {
        let mut seq: Vec<String> = ctx.get("seq")?.unwrap_or_default();
        for tick in events {
            seq.push(format!("e{}", tick.at));
            if let Some(at) = tick.timer {
                let name = tick.name.clone().unwrap_or_else(|| format!("tick-{at}"));
                ctx.set_timer_bytes(&name, at, b"")?;
            }
        }
        ctx.set("seq", &seq)
    }
}

/// Fires the probe's timers: appends `<name>@<at>` of each to the state
/// entry `fired` (a JSON list); a timer named `chain` sets `chain-next` 5 ms
/// later, and one named `self` tries to set itself again at its own time
/// and writes the refusal to the entry `refused`. A `tick-` timer (set by
/// [`Tick`]) appends `t<at>` to the entry `seq` instead; one whose name
/// starts with `fail` fails the call (after writing `seq`, which the host
/// takes back).
impl wakuwaku_guest::OnTimers for Probe {
    fn fire(ctx: &mut Context<'_>, timers: &[wakuwaku_guest::Timer]) -> Result<(), HandlerError> {
        if timers.iter().any(|timer| timer.name.starts_with("fail")) {
            ctx.set("seq", &["written by a failed call"])?;
            return Err(HandlerError::unrecoverable("fire fails on cue"));
        }
        if timers.iter().any(|timer| timer.name.starts_with("tick-")) {
            let mut seq: Vec<String> = ctx.get("seq")?.unwrap_or_default();
            for timer in timers {
                seq.push(format!("t{}", timer.at));
            }
            return ctx.set("seq", &seq);
        }
        let mut fired: Vec<String> = ctx.get("fired")?.unwrap_or_default();
        for timer in timers {
            fired.push(format!("{}@{}", timer.name, timer.at));
            match timer.name.as_str() {
                "chain" => ctx.set_timer_bytes("chain-next", timer.at + 5, b"")?,
                "self" => {
                    if let Err(refused) = ctx.set_timer_bytes("self", timer.at, b"") {
                        ctx.set("refused", &refused.message)?;
                    }
                }
                _ => {}
            }
        }
        ctx.set("fired", &fired)
    }
}

wakuwaku_guest::export_module!(
    Probe: Spin, Hog, Leak, Panic, Note, Fail, Recurse, Chatter, Peek, Ledger, TimedLedger, Ordered, Shipped,
        Returned, Inspected, Raw, Tick;
    emits: ["notes-out", "out"];
    timers: Probe
);
