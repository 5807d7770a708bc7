//! The vocabulary shared with the host: tags, orderings, algebras, errors.

use std::fmt;

/// Tags, orderings and algebras are the host's own types: one definition
/// of the contract's vocabulary for both sides.
pub use wakuwaku_core::event::{Algebra, EventAtomicOrdering, EventTiming, EventTypeTag};

/// What kind of failure a handler reports; it decides where the host sends
/// the events of the failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// May succeed right away (a busy dependency): the host retries the call
    /// in place a bounded number of times, then treats it as retryable.
    Transient,
    /// May succeed later: the key's unfinished work goes to the retry topic,
    /// and later events of the key queue behind it.
    Retryable,
    /// Will never succeed (bad payload, broken invariant): the events go to
    /// the dead-letter topic with the message; the key goes on.
    Unrecoverable,
}

impl ErrorClass {
    /// The name used by the WIT contract (`transient`, `retryable`,
    /// `unrecoverable`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Retryable => "retryable",
            Self::Unrecoverable => "unrecoverable",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure reported by a handler: a class, which decides where the events
/// go, and a message, which ends up in the dead-letter record or the log.
///
/// Displays as `class: message`, e.g. `unrecoverable: malformed Deposited body: …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError {
    /// Where the host sends the events of the failed call.
    pub class: ErrorClass,
    /// What went wrong, for people.
    pub message: String,
}

impl HandlerError {
    /// An error of the given class.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self { class, message: message.into() }
    }

    /// A failure that may go away right away: retried in place.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, message)
    }

    /// A failure that may go away later: the key goes to the retry topic.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Retryable, message)
    }

    /// A failure that never goes away: the events go to the dead-letter topic.
    pub fn unrecoverable(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Unrecoverable, message)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

impl std::error::Error for HandlerError {}

/// The severity of a log line sent to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the handler could cope with.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    /// The name used by the WIT contract (`trace`, …, `error`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
