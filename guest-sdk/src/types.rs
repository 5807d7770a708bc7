//! The vocabulary shared with the host: tags, orderings, algebras, errors.

use std::fmt;

/// The tag of an event type: a number unique among the event types of one
/// topic, carried in every message's header so the host can plan and route
/// without decoding bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventTypeTag(u32);

impl EventTypeTag {
    /// A tag with the given number.
    pub const fn new(tag: u32) -> Self {
        Self(tag)
    }

    /// The number of this tag, as it appears on the wire.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for EventTypeTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How a message orders itself against events of *other* types of its key.
///
/// Events of one key and one type always keep their log order, whatever they
/// declare. The names mirror [`std::sync::atomic::Ordering`]; the "memory" is
/// the stream of events of one key. See the ordering page of the spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EventAtomicOrdering {
    /// Only its own type's order is kept: it may pass events of other types.
    #[default]
    Relaxed,
    /// Opens something: it starts a segment, later events of the key wait
    /// for it.
    Acquire,
    /// Closes something: it ends a segment, it waits for every earlier event
    /// of the key.
    Release,
    /// A full barrier: nothing passes it in either direction.
    AcqRel,
}

impl EventAtomicOrdering {
    /// Every ordering, in declaration order.
    pub const ALL: [Self; 4] = [Self::Relaxed, Self::Acquire, Self::Release, Self::AcqRel];

    /// The name used by the WIT contract (`relaxed`, `acquire`, `release`,
    /// `acq-rel`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Relaxed => "relaxed",
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::AcqRel => "acq-rel",
        }
    }
}

impl fmt::Display for EventAtomicOrdering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The law an event type obeys; it decides how the host may reduce a run
/// (every event of one type and one key between two fences) before calling
/// the handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algebra {
    /// No law: every event is delivered, in log order.
    #[default]
    NonAssociative,
    /// a·b = b·a: every event is delivered; the order inside a run may relax.
    Commutative,
    /// a·a = a: adjacent duplicates (equal body bytes) are dropped.
    Idempotent,
    /// Both: the run is sorted by body bytes and all duplicates dropped.
    IdempotentCommutative,
    /// a·b = combine(a, b): the run is folded into one event with
    /// [`Event::combine`](crate::Event::combine).
    Associative,
}

impl Algebra {
    /// Every algebra, in declaration order.
    pub const ALL: [Self; 5] =
        [Self::NonAssociative, Self::Commutative, Self::Idempotent, Self::IdempotentCommutative, Self::Associative];

    /// The name used by the WIT contract (`non-associative`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NonAssociative => "non-associative",
            Self::Commutative => "commutative",
            Self::Idempotent => "idempotent",
            Self::IdempotentCommutative => "idempotent-commutative",
            Self::Associative => "associative",
        }
    }
}

impl fmt::Display for Algebra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
