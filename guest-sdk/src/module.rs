//! A module: the event types it handles, dispatched by tag, and the topics
//! it may emit to.

use wakuwaku_core::key::Key;

use crate::context::{Context, HostApi};
use crate::event::{Event, Handler, PartitionKey};
use crate::types::{Algebra, EventAtomicOrdering, EventTiming, HandlerError};

/// One event type a module handles, as `describe` reports it to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventTypeInfo {
    /// [`Event::TYPE_TAG`].
    pub tag: u32,
    /// [`Event::NAME`].
    pub name: &'static str,
    /// [`Event::ALGEBRA`].
    pub algebra: Algebra,
    /// [`Event::MAX_BATCH`].
    pub max_batch: u32,
    /// [`Event::TIMING`].
    pub timing: EventTiming,
}

impl EventTypeInfo {
    /// The description of `E`.
    pub const fn of<E: Event>() -> Self {
        Self { tag: E::TYPE_TAG.get(), name: E::NAME, algebra: E::ALGEBRA, max_batch: E::MAX_BATCH, timing: E::TIMING }
    }
}

/// What a module declares about itself (WIT `module-info`): the event types
/// it handles and the topics it may emit to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// The event types, in the order [`export_module!`](crate::export_module)
    /// lists them.
    pub event_types: Vec<EventTypeInfo>,
    /// The topics the module may emit to; an emit anywhere else is refused.
    pub emits: &'static [&'static str],
}

/// A handler module: every event type it handles, dispatched by tag over
/// encoded bodies. This is the `handler` interface of the WIT contract in
/// plain Rust.
///
/// Do not implement it by hand: [`export_module!`](crate::export_module)
/// implements it from the module's [`Handler`] impls (and, on `wasm32`,
/// exports it as the component's `handler` interface). It is also the native
/// entry point: a native host or benchmark can call
/// `<MyModule as Module>::handle(&mut its_host_api, tag, &key, &bodies)`
/// and run exactly the code the component runs.
///
/// Every function fails with an unrecoverable error naming the tag when the
/// module has no event type with that tag, and with an unrecoverable error
/// naming the type when a body does not decode.
pub trait Module {
    /// The event types this module handles and the topics it may emit to;
    /// the same on every call.
    fn describe() -> ModuleInfo;
    /// The key of a message body ([`PartitionKey::to_key`] of
    /// [`Event::key`]).
    fn key(tag: u32, body: &[u8]) -> Result<Key, HandlerError>;
    /// The ordering a message body asks for ([`Event::atomic_ordering`]).
    fn ordering(tag: u32, body: &[u8]) -> Result<EventAtomicOrdering, HandlerError>;
    /// When the event of a body happened ([`Event::event_time`]) for a
    /// timed type, where none is an unrecoverable error naming the rule
    /// (`event-time-declared`); none for an untimed type.
    fn event_time(tag: u32, body: &[u8]) -> Result<Option<i64>, HandlerError>;
    /// Folds a run of bodies (at least one) of an associative type into one
    /// body ([`Event::combine`]).
    fn combine(tag: u32, bodies: &[Vec<u8>]) -> Result<Vec<u8>, HandlerError>;
    /// Applies a chunk of bodies of one type to `key` ([`Handler::handle`]);
    /// state calls go to `host`.
    fn handle(host: &mut dyn HostApi, tag: u32, key: &Key, bodies: &[Vec<u8>]) -> Result<(), HandlerError>;
    /// Fires `key`'s due `timers` of one time ([`OnTimers::fire`](crate::OnTimers::fire));
    /// a module that names no `timers:` in
    /// [`export_module!`](crate::export_module) sets none, and fails
    /// unrecoverably if it is ever asked.
    fn fire(host: &mut dyn HostApi, key: &Key, timers: &[crate::Timer]) -> Result<(), HandlerError> {
        let _ = (host, key);
        Err(HandlerError::unrecoverable(format!(
            "the module handles no timers, but was asked to fire {} of them",
            timers.len()
        )))
    }
}

/// Implements [`Module`] for a type from the event types it handles (and
/// the topics it may emit to) and, when compiling to `wasm32`, exports it
/// as the component's `handler` interface of [`WIT_PACKAGE`](crate::WIT_PACKAGE).
///
/// ```text
/// wakuwaku_guest::export_module!(Bank: AccountOpened, Deposited, Withdrawn);
/// wakuwaku_guest::export_module!(Audit: Deposited, Withdrawn; emits: ["audit-log", "alerts"]);
/// wakuwaku_guest::export_module!(Sessions: Clicked; emits: ["sessions"]; timers: Sessions);
/// ```
///
/// `timers: T` names the type whose [`OnTimers`](crate::OnTimers) fires
/// the module's timers; a module without it sets no timers.
///
/// The type must implement [`Handler<E>`](Handler) for every listed event
/// type `E`. Checked at compile time, with the host's rules: 1 to 256 event
/// types with distinct tags, every `MAX_BATCH` at least 1, every `NAME` 1 to
/// 128 bytes of letters, digits, `_`, `-`, `.` and `:`; at most 64 emit
/// topics, each a valid topic name (1 to 255 bytes of letters, digits, `_`,
/// `-` and `.`), none twice, none of the host's own (`retry_*`, `dlq_*`).
/// The host checks at load that the topics exist (or creates them with
/// `--create-emit-topics`). Use it once per crate: a component exports one
/// module. On native targets it only implements [`Module`], so `cargo test`
/// needs no WASM.
///
/// Two event types with one tag do not compile:
///
/// ```compile_fail
/// # use serde::{Deserialize, Serialize};
/// # use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError};
/// #[derive(Serialize, Deserialize)]
/// struct A { id: u64 }
/// #[derive(Serialize, Deserialize)]
/// struct B { id: u64 }
/// impl Event for A {
///     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
///     const NAME: &'static str = "A";
///     type Key = u64;
///     fn key(&self) -> u64 { self.id }
/// }
/// impl Event for B {
///     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
///     const NAME: &'static str = "B";
///     type Key = u64;
///     fn key(&self) -> u64 { self.id }
/// }
/// struct M;
/// impl Handler<A> for M {
///     fn handle(_: &mut Context<'_>, _: &[A]) -> Result<(), HandlerError> { Ok(()) }
/// }
/// impl Handler<B> for M {
///     fn handle(_: &mut Context<'_>, _: &[B]) -> Result<(), HandlerError> { Ok(()) }
/// }
/// wakuwaku_guest::export_module!(M: A, B);
/// ```
///
/// Nor does an emit to the host's own topics:
///
/// ```compile_fail
/// # use serde::{Deserialize, Serialize};
/// # use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError};
/// # #[derive(Serialize, Deserialize)]
/// # struct A { id: u64 }
/// # impl Event for A {
/// #     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
/// #     const NAME: &'static str = "A";
/// #     type Key = u64;
/// #     fn key(&self) -> u64 { self.id }
/// # }
/// # struct M;
/// # impl Handler<A> for M {
/// #     fn handle(_: &mut Context<'_>, _: &[A]) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// wakuwaku_guest::export_module!(M: A; emits: ["dlq_accounts"]);
/// ```
#[macro_export]
macro_rules! export_module {
    ($module:ty : $($event:ty),+ $(,)? $(; emits: [$($topic:expr),* $(,)?])? $(; timers: $on:ty)?) => {
        const _: () = $crate::__private::check_event_types(&[$($crate::EventTypeInfo::of::<$event>()),+]);
        const _: () = $crate::__private::check_emits(&[$($($topic),*)?]);

        impl $crate::Module for $module {
            fn describe() -> $crate::ModuleInfo {
                $crate::ModuleInfo {
                    event_types: ::std::vec![$($crate::EventTypeInfo::of::<$event>()),+],
                    emits: &[$($($topic),*)?],
                }
            }

            fn key(tag: u32, body: &[u8]) -> ::core::result::Result<$crate::Key, $crate::HandlerError> {
                $(
                    if tag == <$event as $crate::Event>::TYPE_TAG.get() {
                        return $crate::__private::key::<$event>(body);
                    }
                )+
                ::core::result::Result::Err($crate::__private::unknown_tag(::core::stringify!($module), tag))
            }

            fn ordering(
                tag: u32,
                body: &[u8],
            ) -> ::core::result::Result<$crate::EventAtomicOrdering, $crate::HandlerError> {
                $(
                    if tag == <$event as $crate::Event>::TYPE_TAG.get() {
                        return $crate::__private::ordering::<$event>(body);
                    }
                )+
                ::core::result::Result::Err($crate::__private::unknown_tag(::core::stringify!($module), tag))
            }

            fn event_time(
                tag: u32,
                body: &[u8],
            ) -> ::core::result::Result<::core::option::Option<i64>, $crate::HandlerError> {
                $(
                    if tag == <$event as $crate::Event>::TYPE_TAG.get() {
                        return $crate::__private::event_time::<$event>(body);
                    }
                )+
                ::core::result::Result::Err($crate::__private::unknown_tag(::core::stringify!($module), tag))
            }

            fn combine(
                tag: u32,
                bodies: &[::std::vec::Vec<u8>],
            ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::HandlerError> {
                $(
                    if tag == <$event as $crate::Event>::TYPE_TAG.get() {
                        return $crate::__private::combine::<$event>(bodies);
                    }
                )+
                ::core::result::Result::Err($crate::__private::unknown_tag(::core::stringify!($module), tag))
            }

            fn handle(
                host: &mut dyn $crate::HostApi,
                tag: u32,
                key: &$crate::Key,
                bodies: &[::std::vec::Vec<u8>],
            ) -> ::core::result::Result<(), $crate::HandlerError> {
                $(
                    if tag == <$event as $crate::Event>::TYPE_TAG.get() {
                        return $crate::__private::handle::<Self, $event>(host, key, bodies);
                    }
                )+
                ::core::result::Result::Err($crate::__private::unknown_tag(::core::stringify!($module), tag))
            }

            $(
                fn fire(
                    host: &mut dyn $crate::HostApi,
                    key: &$crate::Key,
                    timers: &[$crate::Timer],
                ) -> ::core::result::Result<(), $crate::HandlerError> {
                    $crate::__private::fire::<$on>(host, key, timers)
                }
            )?
        }

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __WakuwakuExport = $crate::__private::Export<$module>;
            $crate::bindings::export!(__WakuwakuExport with_types_in $crate::bindings);
        };
    };
}

/// Support for [`export_module!`]; not a public API.
#[doc(hidden)]
pub mod __private {
    use wakuwaku_core::limits::{MAX_EMIT_TOPICS, MAX_EVENT_TYPES, is_event_type_name, is_host_topic, is_topic_name};

    use super::*;

    pub use crate::wasm::{Export, WasmHost};

    /// Compile-time checks of a module's event types, with the host's
    /// rules for `module-info`.
    pub const fn check_event_types(types: &[EventTypeInfo]) {
        assert!(!types.is_empty() && types.len() <= MAX_EVENT_TYPES, "a module handles 1 to 256 event types");
        let mut i = 0;
        while i < types.len() {
            assert!(types[i].max_batch >= 1, "an event type of this module has MAX_BATCH 0");
            assert!(
                is_event_type_name(types[i].name),
                "an event type NAME of this module is not 1 to 128 bytes of letters, digits, `_`, `-`, `.` and `:`"
            );
            let mut j = i + 1;
            while j < types.len() {
                assert!(types[i].tag != types[j].tag, "two event types of this module have the same TYPE_TAG");
                j += 1;
            }
            i += 1;
        }
    }

    /// Compile-time checks of a module's emit topics, with the host's rules
    /// for `module-info.emits`.
    pub const fn check_emits(topics: &[&str]) {
        assert!(topics.len() <= MAX_EMIT_TOPICS, "a module declares at most 64 emit topics");
        let mut i = 0;
        while i < topics.len() {
            assert!(
                is_topic_name(topics[i]),
                "an emit topic of this module is not 1 to 255 bytes of letters, digits, `_`, `-` and `.`"
            );
            assert!(!is_host_topic(topics[i]), "modules never emit to the host's own `retry_*` and `dlq_*` topics");
            let mut j = i + 1;
            while j < topics.len() {
                assert!(!same(topics[i], topics[j]), "an emit topic of this module is declared twice");
                j += 1;
            }
            i += 1;
        }
    }

    const fn same(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }

    pub fn unknown_tag(module: &str, tag: u32) -> HandlerError {
        HandlerError::unrecoverable(format!("module {module} has no event type with tag {tag}"))
    }

    /// The key of an event, or an unrecoverable error naming the type.
    pub fn key_of<E: Event>(event: &E) -> Result<Key, HandlerError> {
        event
            .key()
            .to_key()
            .map_err(|e| HandlerError::unrecoverable(format!("the key of a {} is not a key: {e}", E::NAME)))
    }

    pub fn key<E: Event>(body: &[u8]) -> Result<Key, HandlerError> {
        key_of(&E::decode(body)?)
    }

    pub fn ordering<E: Event>(body: &[u8]) -> Result<EventAtomicOrdering, HandlerError> {
        Ok(E::decode(body)?.atomic_ordering())
    }

    pub fn event_time<E: Event>(body: &[u8]) -> Result<Option<i64>, HandlerError> {
        match E::TIMING {
            EventTiming::Untimed => Ok(None),
            EventTiming::Timed | EventTiming::TimedRelaxed => event_time_of(&E::decode(body)?).map(Some),
        }
    }

    /// The event time of an event of a timed type, or an unrecoverable
    /// error naming the rule.
    pub fn event_time_of<E: Event>(event: &E) -> Result<i64, HandlerError> {
        event.event_time().ok_or_else(|| {
            HandlerError::unrecoverable(format!(
                "event-time-declared: {} declares event time, but its `event_time` returned none",
                E::NAME
            ))
        })
    }

    pub fn combine<E: Event>(bodies: &[Vec<u8>]) -> Result<Vec<u8>, HandlerError> {
        if bodies.is_empty() {
            return Err(HandlerError::unrecoverable(format!("combine of no {} events", E::NAME)));
        }
        Ok(E::combine(decode_all(bodies)?)?.encode())
    }

    pub fn handle<M: Handler<E>, E: Event>(
        host: &mut dyn HostApi,
        key: &Key,
        bodies: &[Vec<u8>],
    ) -> Result<(), HandlerError> {
        let events: Vec<E> = decode_all(bodies)?;
        M::handle(&mut Context::new(host, key), &events)
    }

    pub fn fire<M: crate::OnTimers>(
        host: &mut dyn HostApi,
        key: &Key,
        timers: &[crate::Timer],
    ) -> Result<(), HandlerError> {
        M::fire(&mut Context::new(host, key), timers)
    }

    fn decode_all<E: Event>(bodies: &[Vec<u8>]) -> Result<Vec<E>, HandlerError> {
        bodies.iter().map(|body| E::decode(body)).collect()
    }
}
