/**
 * The vocabulary shared with the host: algebras, orderings, timings, error
 * classes, log levels, and the errors a handler throws.
 *
 * Every name is the WIT's own: the types are the ones `jco guest-types`
 * generated from `wit/handler-0.5.wit` (`src/wit/handler-0.5/`), so an
 * algebra is the string `"non-associative"`, ..., exactly as the contract
 * writes it, and crosses the component boundary unchanged. The constant
 * objects (`Algebra.Associative`, ...) are spellings of those strings for
 * authors who prefer names to literals.
 *
 * Rules kept here:
 * - A {@link HandlerError} has a class and a message; `String(error)` is
 *   `class: message`, as the Rust and Python SDKs display it.
 * - A {@link Refusal} is the host's text for a value it refused, starting
 *   with the rule's id; {@link Refused} is the unrecoverable error the
 *   context throws for it, saying what was refused.
 */

import type * as wit from "wakuwaku:handler/types@0.5.0";
import type * as witLog from "wakuwaku:handler/log@0.5.0";

/** The law an event type obeys, which decides how the host may reduce a run. */
export type Algebra = wit.Algebra;
/** The algebras by name. */
export const Algebra = {
  /** No law: every event is delivered, in log order. The default. */
  NonAssociative: "non-associative",
  /** a·b = b·a: delivered unchanged; the order inside a run may relax. */
  Commutative: "commutative",
  /** a·a = a: adjacent duplicates (equal body bytes) are dropped. */
  Idempotent: "idempotent",
  /** Both: the run is sorted by body bytes and all duplicates dropped. */
  IdempotentCommutative: "idempotent-commutative",
  /** a·b = combine(a, b): the run is folded into one event by `combine`. */
  Associative: "associative",
} as const satisfies Record<string, Algebra>;

/** How a message orders itself against other event types of its key. */
export type Ordering = wit.Ordering;
/** The orderings by name (they mirror `std::sync::atomic::Ordering`). */
export const Ordering = {
  /** Only its own type's order is kept. The default. */
  Relaxed: "relaxed",
  /** Opens something: later events of the key wait for it. */
  Acquire: "acquire",
  /** Closes something: it waits for every earlier event of the key. */
  Release: "release",
  /** A full barrier: both of the above. */
  AcqRel: "acq-rel",
} as const satisfies Record<string, Ordering>;

/** Whether an event type's events carry an event time. */
export type Timing = wit.Timing;
/** The timings by name. */
export const Timing = {
  /** No event time: applied as they arrive, in log order. The default. */
  Untimed: "untimed",
  /** Every event has one; a key's events of timed types are applied in event-time order. */
  Timed: "timed",
  /** Timed, but may move past the key's events of other timed types as their ordering allows. */
  TimedRelaxed: "timed-relaxed",
} as const satisfies Record<string, Timing>;

/** What kind of failure a handler reports; it decides where the events go. */
export type ErrorClass = wit.ErrorClass;
/** The error classes by name. */
export const ErrorClass = {
  /** May succeed right away: retried in place a bounded number of times. */
  Transient: "transient",
  /** May succeed later: the key's unfinished work goes to the retry topic. */
  Retryable: "retryable",
  /** Will never succeed: the events go to the dead-letter topic. */
  Unrecoverable: "unrecoverable",
} as const satisfies Record<string, ErrorClass>;

/**
 * A pending timer of the key being handled (the WIT record `timer`): its
 * name, unique among the key's timers; the event time it fires at (ms
 * since the Unix epoch, an s64); and the payload it carries to the call
 * that fires it.
 */
export type Timer = wit.Timer;

/** The severity of a log line. */
export type Level = witLog.Level;
/** The levels by name. */
export const Level = {
  Trace: "trace",
  Debug: "debug",
  Info: "info",
  Warn: "warn",
  Error: "error",
} as const satisfies Record<string, Level>;

const ALGEBRAS: readonly string[] = Object.values(Algebra);
const ORDERINGS: readonly string[] = Object.values(Ordering);
const TIMINGS: readonly string[] = Object.values(Timing);

/** Whether `value` is one of the WIT's algebras. */
export function isAlgebra(value: unknown): value is Algebra {
  return typeof value === "string" && ALGEBRAS.includes(value);
}

/** Whether `value` is one of the WIT's orderings. */
export function isOrdering(value: unknown): value is Ordering {
  return typeof value === "string" && ORDERINGS.includes(value);
}

/** Whether `value` is one of the WIT's timings. */
export function isTiming(value: unknown): value is Timing {
  return typeof value === "string" && TIMINGS.includes(value);
}

/**
 * A failure a handler reports: a class, which decides where the events go,
 * and a message, which ends up in the dead-letter record or the log. Throw
 * one of the subclasses, or this class with an explicit class.
 */
export class HandlerError extends Error {
  /** Where the host sends the events of the failed call. */
  readonly errorClass: ErrorClass;

  constructor(errorClass: ErrorClass, message: string) {
    super(String(message));
    this.errorClass = errorClass;
    this.name = new.target.name;
  }

  override toString(): string {
    return `${this.errorClass}: ${this.message}`;
  }
}

/** May succeed right away (a busy dependency): retried in place. */
export class TransientError extends HandlerError {
  constructor(message: string) {
    super("transient", message);
  }
}

/** May succeed later: the key's unfinished work goes to the retry topic. */
export class RetryableError extends HandlerError {
  constructor(message: string) {
    super("retryable", message);
  }
}

/** Will never succeed: the events go to the dead-letter topic. */
export class UnrecoverableError extends HandlerError {
  constructor(message: string) {
    super("unrecoverable", message);
  }
}

/** The id of the rule a refusal text names: what comes before its first `:`. */
function ruleOf(text: string): string {
  const colon = text.indexOf(":");
  return colon < 0 ? text : text.slice(0, colon);
}

/**
 * The host refused a value a {@link HostApi} call handed it: the host's
 * `refusal` text, which starts with the rule's id (`state-value-size: ...`).
 * The context turns it into {@link Refused}.
 */
export class Refusal extends Error {
  constructor(text: string) {
    super(text);
    this.name = "Refusal";
  }

  /** The id of the rule broken, e.g. `state-value-size`. */
  get rule(): string {
    return ruleOf(this.message);
  }
}

/**
 * A context call the host refused (a state value over the limit, an emit to
 * an undeclared topic, ...): unrecoverable, its message saying what was
 * refused and the host's reason, as the Rust SDK words it:
 * ``cannot write state entry `big`: state-value-size: ...``. Nothing of the
 * refused value was kept; a handler may catch it and go on.
 */
export class Refused extends UnrecoverableError {
  /** The host's text, starting with the rule's id. */
  readonly refusal: string;

  constructor(what: string, refusal: Refusal | string) {
    const text = typeof refusal === "string" ? refusal : refusal.message;
    super(`${what}: ${text}`);
    this.refusal = text;
  }

  /** The id of the rule broken, e.g. `state-value-size`. */
  get rule(): string {
    return ruleOf(this.refusal);
  }
}
