//! What every older contract's adapter holds: its capabilities served by
//! the current ones, and its types converted to the current contract's.
//!
//! Rules kept here:
//! - **One adapter, written once.** An older contract whose `state`,
//!   `emit` and `log` interfaces have the functions and types of the
//!   current ones is served by [`older_contract!`], expanded inside its
//!   own file beside its bindings (`bindings::wakuwaku::handler::{emit, log,
//!   state, types}` in scope, and `current` naming the current
//!   contract's): each value is converted and handed on, so every rule is
//!   the one the current capability keeps. What differs between versions
//!   (the description's timings) stays in each version's file.

/// The linker, the host traits and the conversions of an older contract
/// (its version as text, e.g. `"0.2"`) whose imports match the current
/// contract's.
macro_rules! older_contract {
    ($version:literal) => {
        #[doc = concat!("Links the ", $version, " `types`, `state`, `emit` and `log` interfaces.")]
        pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
            types::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
            state::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
            emit::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
            log::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
        }

        impl types::Host for StoreData {}

        type Answer<T> = wasmtime::Result<Result<T, String>>;

        impl state::Host for StoreData {
            fn get(&mut self, name: String) -> Answer<Option<Vec<u8>>> {
                current::state::Host::get(self, name)
            }

            fn set(&mut self, name: String, value: Vec<u8>) -> Answer<()> {
                current::state::Host::set(self, name, value)
            }

            fn delete(&mut self, name: String) -> Answer<()> {
                current::state::Host::delete(self, name)
            }

            fn counter_add(&mut self, name: String, delta: i64) -> Answer<()> {
                current::state::Host::counter_add(self, name, delta)
            }

            fn counter_get(&mut self, name: String) -> Answer<i64> {
                current::state::Host::counter_get(self, name)
            }
        }

        impl emit::Host for StoreData {
            fn emit(&mut self, message: types::Outgoing) -> Result<(), String> {
                let message = current::types::Outgoing {
                    topic: message.topic,
                    tag: message.tag,
                    key: message.key,
                    ordering: ordering(message.ordering),
                    algebra: algebra(message.algebra),
                    body: message.body,
                };
                current::emit::Host::emit(self, message)
            }
        }

        impl log::Host for StoreData {
            fn log(&mut self, level: log::Level, message: String) {
                let level = match level {
                    log::Level::Trace => current::log::Level::Trace,
                    log::Level::Debug => current::log::Level::Debug,
                    log::Level::Info => current::log::Level::Info,
                    log::Level::Warn => current::log::Level::Warn,
                    log::Level::Error => current::log::Level::Error,
                };
                current::log::Host::log(self, level, message);
            }
        }

        #[doc = concat!("A ", $version, " ordering as the current contract's.")]
        pub(super) fn ordering(ordering: types::Ordering) -> current::types::Ordering {
            match ordering {
                types::Ordering::Relaxed => current::types::Ordering::Relaxed,
                types::Ordering::Acquire => current::types::Ordering::Acquire,
                types::Ordering::Release => current::types::Ordering::Release,
                types::Ordering::AcqRel => current::types::Ordering::AcqRel,
            }
        }

        fn algebra(algebra: types::Algebra) -> current::types::Algebra {
            match algebra {
                types::Algebra::NonAssociative => current::types::Algebra::NonAssociative,
                types::Algebra::Commutative => current::types::Algebra::Commutative,
                types::Algebra::Idempotent => current::types::Algebra::Idempotent,
                types::Algebra::IdempotentCommutative => current::types::Algebra::IdempotentCommutative,
                types::Algebra::Associative => current::types::Algebra::Associative,
            }
        }

        #[doc = concat!("A ", $version, " handler error as the current contract's.")]
        pub(super) fn error(error: types::HandlerError) -> current::types::HandlerError {
            let class = match error.class {
                types::ErrorClass::Transient => current::types::ErrorClass::Transient,
                types::ErrorClass::Retryable => current::types::ErrorClass::Retryable,
                types::ErrorClass::Unrecoverable => current::types::ErrorClass::Unrecoverable,
            };
            current::types::HandlerError { class, message: error.message }
        }

        #[doc = concat!("A ", $version, " answer with its error as the current contract's.")]
        pub(super) fn answer<T>(
            answer: wasmtime::Result<Result<T, types::HandlerError>>,
        ) -> wasmtime::Result<Result<T, current::types::HandlerError>> {
            answer.map(|result| result.map_err(error))
        }
    };
}
