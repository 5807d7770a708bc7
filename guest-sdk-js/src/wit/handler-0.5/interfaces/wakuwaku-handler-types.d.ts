declare module 'wakuwaku:handler/types@0.5.0' {
  /**
   * The law an event type obeys, which decides how the host may reduce a
   * run (every event of one type and one key between two fences).
   * # Variants
   * 
   * ## `"non-associative"`
   * 
   * No law: every event is delivered, in log order.
   * ## `"commutative"`
   * 
   * a·b = b·a: delivered unchanged; the order inside a run may relax.
   * ## `"idempotent"`
   * 
   * a·a = a: adjacent duplicates (equal body bytes) are dropped.
   * ## `"idempotent-commutative"`
   * 
   * Both: the run is sorted by body bytes and all duplicates dropped.
   * ## `"associative"`
   * 
   * a·b = combine(a, b): the run is folded into one event by `combine`.
   */
  export type Algebra = 'non-associative' | 'commutative' | 'idempotent' | 'idempotent-commutative' | 'associative';
  /**
   * How a message orders itself against other event types of its key.
   * The names mirror `std::sync::atomic::Ordering`.
   * # Variants
   * 
   * ## `"relaxed"`
   * 
   * Only its own type's order is kept.
   * ## `"acquire"`
   * 
   * Opens something: later events of the key wait for it.
   * ## `"release"`
   * 
   * Closes something: it waits for every earlier event of the key.
   * ## `"acq-rel"`
   * 
   * A full barrier: both of the above.
   */
  export type Ordering = 'relaxed' | 'acquire' | 'release' | 'acq-rel';
  /**
   * Whether an event type's events carry an event time (see "Event
   * time").
   * # Variants
   * 
   * ## `"untimed"`
   * 
   * No event time: applied as they arrive, in log order.
   * ## `"timed"`
   * 
   * Every event has one, which `event-time` returns from its body
   * and the publisher writes into `waku-event-time`; a key's events
   * of `timed` types reach `handle` in event-time order
   * (`event-time-order`).
   * ## `"timed-relaxed"`
   * 
   * Timed as `timed` is, but its events may move past the key's
   * events of other timed types as their `ordering` allows.
   */
  export type Timing = 'untimed' | 'timed' | 'timed-relaxed';
  /**
   * One event type a module handles.
   */
  export interface EventType {
    /**
     * Unique among the event types of one topic (`event-type-tag`).
     */
    tag: number,
    /**
     * A human name, used in logs, metrics and errors: 1 to 128 bytes,
     * letters, digits, `_`, `-`, `.` and `:` (`event-type-name`).
     */
    name: string,
    algebra: Algebra,
    /**
     * The most events one `handle` call receives: at least 1
     * (`max-batch`).
     */
    maxBatch: number,
    /**
     * Whether its events carry an event time (`event-time-declared`).
     */
    timing: Timing,
  }
  /**
   * What a module declares about itself; read once, when it is loaded.
   * A description that breaks a rule refuses the module's load, naming
   * the rule.
   */
  export interface ModuleInfo {
    /**
     * The event types it handles: at least one, at most 256
     * (`event-type-count`), tags unique.
     */
    eventTypes: Array<EventType>,
    /**
     * The topics it may emit to: at most 64 (`emit-topic-count`), each
     * a valid topic name, 1 to 255 bytes of letters, digits, `_`, `-`
     * and `.` (`emit-topic-name`), none twice (`emit-topic-duplicate`),
     * none of the host's own topics, `retry_*` and `dlq_*`
     * (`emit-topic-host-owned`). They must exist in the log when the
     * module is loaded for a running projection, at start-up and on
     * hot reload (or are created when the operator asks for it with
     * `--create-emit-topics`); otherwise the load fails naming the
     * topic, and on reload the old version keeps running. Nor may it
     * be the topic the module's projection consumes (`emit-loop`: each
     * message would come back as an event); the projection refuses
     * such a module at start-up and on reload. An emit to any other
     * topic is refused.
     */
    emits: Array<string>,
  }
  /**
   * What kind of failure a handler reports; it decides where events go.
   * # Variants
   * 
   * ## `"transient"`
   * 
   * May succeed right away (a busy dependency): retried in place.
   * ## `"retryable"`
   * 
   * May succeed later: the key's unfinished work goes to retry.
   * ## `"unrecoverable"`
   * 
   * Will never succeed (bad payload, broken invariant): dead letter.
   */
  export type ErrorClass = 'transient' | 'retryable' | 'unrecoverable';
  /**
   * A failure reported by the module.
   */
  export interface HandlerError {
    'class': ErrorClass,
    message: string,
  }
  /**
   * A message a handler publishes to another topic.
   */
  export interface Outgoing {
    /**
     * One of the topics the module declared in `module-info.emits`.
     */
    topic: string,
    tag: number,
    /**
     * The message's key, in canonical bytes (see "Keys").
     */
    key: Uint8Array,
    ordering: Ordering,
    algebra: Algebra,
    /**
     * At least 1 byte, at most the host's emit body limit.
     */
    body: Uint8Array,
  }
  /**
   * A pending timer of the key being handled.
   */
  export interface Timer {
    /**
     * Unique among the key's timers: 1 to 128 bytes, no NUL
     * (`timer-name`).
     */
    name: string,
    /**
     * The event time it fires at, in milliseconds since the Unix
     * epoch (UTC).
     */
    at: bigint,
    /**
     * What the module gave it to carry to `fire`: at most the timer
     * payload limit (default 1 KiB, `timer-payload-size`).
     */
    payload: Uint8Array,
  }
  /**
   * Why the host refused a value a module handed it: the rule's id,
   * then what is wrong, in words (and the limit, where there is one),
   * e.g. `state-value-size: state value `balance` has 2000000 bytes,
   * over the limit of 1048576 bytes`.
   */
  export type Refusal = string;
}
