//! Write wakuwaku event handlers in plain Rust and export them as WebAssembly
//! components.
//!
//! A handler module is a Rust type. Each event type is a serde struct that
//! implements [`Event`] (its tag, name, key, ordering and algebra); the module
//! implements [`Handler<E>`](Handler) once per event type; one
//! [`export_module!`] line ties them together (and lists the topics the
//! module may emit to). Build with
//! `cargo build --target wasm32-wasip2 --release` and hand the `.wasm` to the
//! host; test with a plain `cargo test`, using [`testing::MemoryHost`].
//!
//! # A minimal handler
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError, PartitionKey};
//!
//! /// What order is scoped to: one user.
//! #[derive(Serialize)]
//! pub struct UserId(pub u64);
//!
//! impl PartitionKey for UserId {}
//!
//! /// A user visited a page.
//! #[derive(Serialize, Deserialize)]
//! pub struct Visited {
//!     pub user: u64,
//!     pub page: String,
//! }
//!
//! impl Event for Visited {
//!     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
//!     const NAME: &'static str = "Visited";
//!     type Key = UserId;
//!
//!     fn key(&self) -> UserId {
//!         UserId(self.user)
//!     }
//! }
//!
//! /// The module: counts visits per user and in total.
//! pub struct Visits;
//!
//! impl Handler<Visited> for Visits {
//!     fn handle(ctx: &mut Context<'_>, events: &[Visited]) -> Result<(), HandlerError> {
//!         let seen: u64 = ctx.get("visits")?.unwrap_or(0);
//!         ctx.set("visits", &(seen + events.len() as u64))?;
//!         ctx.counter_add("all_visits", events.len() as i64)?;
//!         Ok(())
//!     }
//! }
//!
//! wakuwaku_guest::export_module!(Visits: Visited);
//!
//! // A native unit test: no WASM, no host.
//! let mut host = wakuwaku_guest::testing::MemoryHost::new();
//! let visit = |user: u64| Visited { user, page: "/".into() };
//! host.handle::<Visits, _>(&[visit(7), visit(7), visit(8)])?;
//! assert_eq!(host.get::<u64>(&UserId(7), "visits"), Some(2));
//! assert_eq!(host.counter("all_visits"), 3);
//! # Ok::<(), HandlerError>(())
//! ```
//!
//! The crate of such a module has `crate-type = ["cdylib", "rlib"]`: the
//! `cdylib` becomes the component, the `rlib` lets tests and native hosts
//! call it.
//!
//! # Keys
//!
//! A key is what order and state are scoped to. It crosses the boundary as
//! **canonical bytes**, the same in every guest language, so that a
//! publisher, the host and any module agree on which events share a key.
//! The host keeps the bytes with every message, in state, and in retry and
//! dead-letter records; two keys are one exactly when their bytes are
//! equal (it derives a 64-bit hash from them only to pick a partition).
//! It shows a key as JSON text: `42`, `"ann"`, `[42,"eur"]`,
//! `{"bytes":"00ff"}`; `waku state get --key` takes that text.
//!
//! A key is one value: an integer, a string, a byte string, or a tuple of
//! those, encoded as:
//!
//! | value | bytes |
//! | --- | --- |
//! | integer from `i64::MIN` to `u64::MAX` | `0x01`, then the zigzag form of the value (`n ≥ 0` → `2n`, `n < 0` → `−2n − 1`) as unsigned LEB128, shortest form |
//! | string (UTF-8) | `0x02`, the byte length as unsigned LEB128, the bytes |
//! | byte string | `0x03`, the length as unsigned LEB128, the bytes |
//! | tuple | `0x04`, the element count as unsigned LEB128, each element |
//!
//! At most 1024 bytes in all, tuples nested at most 16 deep, nothing after
//! the value. So `42` is `01 54`, `-1` is `01 01`, `"ann"` is
//! `02 03 61 6e 6e`, and `[42, "eur"]` is `04 02 01 54 02 03 65 75 72`. The
//! host refuses anything else (a `key` export returning such bytes fails
//! the call, an emit with them is refused). Test vectors for other
//! languages, text form to bytes, are in `core/tests/key_vectors.json`.
//!
//! In Rust a key type derives `Serialize` and implements [`PartitionKey`];
//! its bytes come from its serde shape
//! ([`wakuwaku_core::key_serde`]): integers of every width and `bool`
//! (0 or 1) are integers, `char` and `str` strings, `serialize_bytes`
//! (e.g. `serde_bytes::ByteBuf`) byte strings, a newtype is its inner value,
//! and structs, tuples and sequences are tuples of their fields; a unit
//! enum variant is its name. So `AccountId(42)` has the bytes of `42u64`.
//! Floats, maps, options and enum variants with data are no keys: the
//! `key` export fails with an error naming the type. A `Vec<u8>` is a
//! sequence (a tuple of integers), not a byte string. Changing a key
//! type's shape changes its bytes, and the state of existing keys is then
//! no longer found.
//!
//! # Event time
//!
//! An event type whose events say when they happened declares it, as it
//! declares its algebra: `const TIMING = EventTiming::Timed` and an
//! [`Event::event_time`] that reads the time from the event (milliseconds
//! since the Unix epoch, UTC). `waku publish` asks the module for it and
//! writes it into the message's `waku-event-time` header; the host then
//! applies a key's timed events in event-time order across every topic of
//! the projection (ties: the topic's place in the projection, then the
//! position in the log), once the log's end offsets show nothing earlier
//! can still come. The rules (in `wit/handler-0.5.wit`, "Event time"):
//!
//! - `event-time-declared`: a timed event whose `event_time` returns `None`
//!   is not published (an unrecoverable error naming the rule); a message
//!   of a timed type that reaches the host without the header (written by
//!   another producer) is dead-lettered with a reason naming the rule.
//! - `event-time-untimed`: an untimed type (the default) is never asked,
//!   and a header on its messages is ignored: they are applied as they
//!   arrive. A module built for the 0.2 contract has only untimed types.
//! - `event-time-order`: a key's events of `Timed` types reach the handler
//!   in event-time order, whatever their types and orderings (where the
//!   type changes, the host plans the event as a full barrier; consecutive
//!   events of one type still form one run). To let a type's events move
//!   past the key's events of other timed types as their
//!   [`Event::atomic_ordering`] allows (one run per type between fences,
//!   fewer handler calls), declare `const TIMING =
//!   EventTiming::TimedRelaxed` instead.
//!
//! What each ordering means to a handler, per key:
//!
//! | ordering | without event time (untimed) | between `Timed` types | `TimedRelaxed` |
//! | --- | --- | --- | --- |
//! | `Relaxed` | may move past other types' events | event-time order | may move past other types' events |
//! | `Acquire` | later events wait for it | event-time order | later events wait for it |
//! | `Release` | waits for every earlier event | event-time order | waits for every earlier event |
//! | `AcqRel` | nothing passes it either way | event-time order | nothing passes it either way |
//!
//! Events of one type and one key always keep their order (for timed
//! types, event-time order).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use wakuwaku_guest::{Event, EventTiming, EventTypeTag};
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Shipped {
//!     pub product: u64,
//!     pub quantity: u32,
//!     /// When it left the warehouse, ms since the epoch.
//!     pub at_ms: i64,
//! }
//!
//! impl Event for Shipped {
//!     const TYPE_TAG: EventTypeTag = EventTypeTag::new(10);
//!     const NAME: &'static str = "Shipped";
//!     const TIMING: EventTiming = EventTiming::Timed;
//!     type Key = u64;
//!
//!     fn key(&self) -> u64 {
//!         self.product
//!     }
//!
//!     fn event_time(&self) -> Option<i64> {
//!         Some(self.at_ms)
//!     }
//! }
//! ```
//!
//! [`testing::MemoryHost::handle_in_event_time_order`] applies events of
//! several types in the order the host would.
//!
//! # Errors and refusals
//!
//! A handler returns a [`HandlerError`]; its [`ErrorClass`] decides where the
//! host sends the events of the failed call:
//!
//! - [`HandlerError::transient`]: may succeed right away (a busy dependency);
//!   the host retries the call in place a few times, then treats it as
//!   retryable.
//! - [`HandlerError::retryable`]: may succeed later; the key's unfinished work
//!   goes to the retry topic and its later events queue behind it.
//! - [`HandlerError::unrecoverable`]: will never succeed; the events go to the
//!   dead-letter topic with the message (cut to 4 KiB), and the key goes on.
//!
//! The host checks every value a handler hands it, and refuses one that
//! breaks a rule with a message starting with the rule's id (the rules, and
//! their limits, are in `wit/handler-0.5.wit` and
//! [`wakuwaku_core::limits`]): entry and counter names of 1 to 256 bytes
//! (`name-length`) without NUL (`name-nul`), state values up to the host's limit
//! (`state-value-size`), per call at most so many state writes, bytes,
//! counter changes, emits and emitted bytes (`state-writes-per-call`,
//! `state-bytes-per-call`, `counter-changes-per-call`, `emits-per-call`,
//! `emit-bytes-per-call`), counters within `i64` (`counter-range`), at most
//! so many counters in the projection and entries in a key (`counter-count`,
//! `entries-per-key`: a new one past the quota is refused, changing,
//! overwriting or deleting what exists never is), emits only to declared
//! topics (`emit-topic`) with a body of 1 byte to the host's limit
//! (`emit-body-size`). [`Context`] turns a refusal into an
//! unrecoverable error naming the entry and the rule. Log lines are cut and
//! counted, never refused. [`testing::MemoryHost`] keeps the same rules
//! with the same limits and messages.
//!
//! The SDK itself returns unrecoverable errors for a body that does not
//! decode (naming the event type), a tag the module does not handle (naming
//! the tag), a state entry that does not decode as the requested type
//! (naming the entry), a key of no key shape, and a `combine` on a type
//! that is not associative. A panic in a handler traps the component: the
//! host treats a trap as retryable, with the panic message as the reason.
//! Whatever the error, nothing the failed call wrote is kept.
//!
//! # Layout
//!
//! - [`Event`], [`PartitionKey`] and [`Handler`]: what an author implements.
//! - [`Context`]: what a handler can do during a call (its key, state,
//!   counters, emit, log), over the raw [`HostApi`].
//! - [`Module`] and [`export_module!`]: dispatch by tag over encoded bodies;
//!   the WIT `handler` interface in plain Rust, and the native entry point.
//! - [`testing`]: an in-memory host for unit tests.
//!
//! The component targets the WIT package [`WIT_PACKAGE`]; the generated
//! bindings are an implementation detail, and the only place with `unsafe`.

mod context;
mod event;
mod module;
pub mod testing;
mod types;
mod wasm;
pub mod windows;

pub use context::{Context, HostApi, Outgoing, Refusal};
pub use event::{Event, Handler, OnTimers, PartitionKey};
#[doc(hidden)]
pub use module::__private;
pub use module::{EventTypeInfo, Module, ModuleInfo};
pub use types::{Algebra, ErrorClass, EventAtomicOrdering, EventTiming, EventTypeTag, HandlerError, Level};
pub use wakuwaku_core::key::{Key, KeyError, KeyValue};
pub use wakuwaku_core::limits::PayloadLimits;
pub use wakuwaku_core::timers::Timer;

/// The WIT package and version this SDK's components implement, read from
/// `wit/handler-0.5.wit`.
pub const WIT_PACKAGE: &str = wakuwaku_core::limits::CONTRACT;

/// Bindings generated from `wit/handler-0.5.wit` (world `module`); used by
/// [`export_module!`], not meant to be used directly.
#[doc(hidden)]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/handler-0.5.wit",
        world: "module",
        pub_export_macro: true,
        default_bindings_module: "wakuwaku_guest::bindings",
    });
}
