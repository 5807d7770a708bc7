//! Write wakuwaku event handlers in plain Rust and export them as WebAssembly
//! components.
//!
//! A handler module is a Rust type. Each event type is a serde struct that
//! implements [`Event`] (its tag, name, key, ordering and algebra); the module
//! implements [`Handler<E>`](Handler) once per event type; one
//! [`export_module!`] line ties them together. Build with
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
//! #[derive(Hash)]
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
//!         ctx.counter_add("all_visits", events.len() as i64);
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
//! # Errors
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
//!   dead-letter topic with the message, and the key goes on.
//!
//! The SDK itself returns unrecoverable errors for a body that does not
//! decode (naming the event type), a tag the module does not handle (naming
//! the tag), a state entry that does not decode as the requested type or
//! exceeds the host's size limit (naming the entry), and a `combine` on a
//! type that is not associative. A panic in a handler traps the component:
//! the host treats a trap as retryable, with the panic message as the reason.
//! Whatever the error, nothing the failed call wrote is kept.
//!
//! # Layout
//!
//! - [`Event`], [`PartitionKey`] and [`Handler`]: what an author implements.
//! - [`Context`]: what a handler can do during a call (state, counters, emit,
//!   log), over the raw [`HostApi`].
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

pub use context::{Context, HostApi, Outgoing};
pub use event::{Event, Handler, PartitionKey, stable_hash};
#[doc(hidden)]
pub use module::__private;
pub use module::{EventTypeInfo, Module};
pub use types::{Algebra, ErrorClass, EventAtomicOrdering, EventTypeTag, HandlerError, Level};

/// The WIT package and version this SDK's components implement.
pub const WIT_PACKAGE: &str = "wakuwaku:handler@0.1.0";

/// Bindings generated from `wit/` (world `module`); used by
/// [`export_module!`], not meant to be used directly.
#[doc(hidden)]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "module",
        pub_export_macro: true,
        default_bindings_module: "wakuwaku_guest::bindings",
    });
}
