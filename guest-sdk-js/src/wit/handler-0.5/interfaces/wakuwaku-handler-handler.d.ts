/// <reference path="./wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/handler@0.5.0' {
  /**
   * What the module handles and where it may emit. Called once, at load.
   */
  export function describe(): ModuleInfo;
  /**
   * The key of a message body, in canonical bytes (see "Keys";
   * anything else fails the call: `key-canonical`).
   */
  export function key(tag: number, body: Uint8Array): Uint8Array;
  /**
   * The ordering a message body asks for.
   */
  export function ordering(tag: number, body: Uint8Array): MessageOrdering;
  /**
   * When the event of a message body happened, in milliseconds since the
   * Unix epoch (UTC; before 1970 is negative). Asked only about timed
   * event types (`timed`, `timed-relaxed`), where `none` fails the call
   * (`event-time-declared`);
   * an `untimed` type answers `none`.
   */
  export function eventTime(tag: number, body: Uint8Array): bigint | undefined;
  /**
   * Folds a run of bodies of an associative type into one body, 1 byte
   * to the host's emit body limit (`combine-body-size`). A long run is
   * folded in parts (at most 4 MiB of bodies per call, but at least two
   * bodies), then the parts' results, in order: what `combine` returns
   * may come back to it as a body.
   */
  export function combine(tag: number, bodies: Array<Uint8Array>): Uint8Array;
  /**
   * Applies a chunk of events of one type to one key (`key` in canonical
   * bytes).
   */
  export function handle(tag: number, key: Uint8Array, bodies: Array<Uint8Array>): void;
  /**
   * Fires the key's due timers of one time (`key` in canonical bytes),
   * in name order; they are no longer pending once the call succeeds.
   * The call may use state, emit, log and timers as `handle` does (a
   * timer only later than these, `timer-at-firing`). A failed call
   * keeps nothing it did and its timers stay pending (fired again as a
   * failed `handle` call's events are tried again), except that an
   * `unrecoverable` error drops them, with a warning naming the key
   * and the timers.
   */
  export function fire(key: Uint8Array, timers: Array<Timer>): void;
  export type ModuleInfo = import('wakuwaku:handler/types@0.5.0').ModuleInfo;
  export type MessageOrdering = import('wakuwaku:handler/types@0.5.0').Ordering;
  export type HandlerError = import('wakuwaku:handler/types@0.5.0').HandlerError;
  export type Timer = import('wakuwaku:handler/types@0.5.0').Timer;
}
