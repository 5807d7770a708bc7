/**
 * Write wakuwaku event handlers in TypeScript or JavaScript and build them
 * into WebAssembly components with componentize-js.
 *
 * The TypeScript counterpart of the Rust SDK (`guest-sdk/`) and the Python
 * SDK (`guest-sdk-python/`), with the same concepts, limits, errors and key
 * encoding. Each event type is declared with {@link defineEvent} (tag,
 * name, algebra, max batch, timing, key, ordering, event time and combine
 * beside its fields); handlers are functions registered on a
 * {@link Module}; the handler file's default export is the module. Build
 * with `waku build <project>` (esbuild bundles it, componentize-js makes
 * the component against `wit/handler-0.5.wit`, world `module`), test with
 * `node --test`, using `MemoryHost` from `wakuwaku-guest/testing`.
 *
 * A minimal handler:
 *
 *     import { Module, defineEvent, t } from "wakuwaku-guest";
 *
 *     export const Visited = defineEvent({
 *       tag: 1,
 *       name: "Visited",
 *       fields: { user: t.u64, page: t.string },
 *       key: (event) => event.user,
 *     });
 *
 *     const visits = new Module("visits");
 *     visits.handles(Visited, (ctx, events) => {
 *       const seen = ctx.get("visits", t.int) ?? 0;
 *       ctx.set("visits", seen + events.length);
 *       ctx.counterAdd("all_visits", events.length);
 *     });
 *     export default visits;
 *
 * Errors: a handler throws a {@link HandlerError}; its class decides where
 * the host sends the events of the failed call ({@link TransientError}:
 * retried in place; {@link RetryableError}: to the retry topic;
 * {@link UnrecoverableError}: dead-lettered). The SDK itself throws
 * unrecoverable errors for a body that does not decode (naming the type),
 * a tag the module does not handle (naming the tag), a state entry that
 * does not fit its schema (naming the entry) and a `combine` on a type
 * that is not associative. A value the host refuses throws
 * {@link Refused}, an unrecoverable error whose message names the rule; a
 * handler may catch it and go on. Anything else thrown fails the call as
 * retryable, as a trap would. Whatever the error, nothing the failed call
 * wrote is kept.
 *
 * Timers (contract 0.5): `ctx.setTimer(name, at, payload)`,
 * `ctx.cancelTimer(name)` and `ctx.timer(name)` in any handler; the module's
 * timer handler, registered with {@link Module.onTimers}, fires a key's due
 * timers of one time once the projection's clock passes them
 * (`docs/timers.md`); `MemoryHost.advance(clock)` fires them in tests.
 * {@link Windows} builds tumbling, hopping and session windows on them.
 *
 * Layout: `types.ts` (vocabulary and errors), `event.ts`
 * ({@link defineEvent}), `schema.ts` ({@link t}), `json.ts` (JSON with
 * 64-bit integers), `key.ts` (the canonical key encoding), `context.ts`
 * ({@link Context}), `module.ts` ({@link Module}), `limits.ts` and
 * `reduce.ts` (the host's rules, for the test host), `windows.ts`
 * ({@link Windows}), `testing.ts`
 * (`MemoryHost`), `component.ts` (the bridge to the WIT bindings, imported
 * only by the component build), `wit/` (types generated from the WIT with
 * `jco guest-types`).
 */

export { Context, type HostApi, type Outgoing, outgoing, timerPayload } from "./context.js";
export { type Event, type EventOf, type EventType, defineEvent } from "./event.js";
export { type JsonValue, parseJson, writeJson } from "./json.js";
export {
  type DecodedKey,
  KeyFormatError,
  type KeyValue,
  decodeKey,
  encodeKey,
  keyText,
  parseKeyText,
} from "./key.js";
export { type EventTypeInfo, type Handler, Module, type ModuleInfo, type TimerHandler } from "./module.js";
export { DecodeError, type Infer, type Schema, t } from "./schema.js";
export {
  Algebra,
  ErrorClass,
  HandlerError,
  Level,
  Ordering,
  Refusal,
  Refused,
  RetryableError,
  type Timer,
  Timing,
  TransientError,
  UnrecoverableError,
} from "./types.js";
export { type Aggregate, type Placed, type Window, type WindowKind, Windows } from "./windows.js";

/** The WIT package and version this SDK's components implement. */
export const WIT_PACKAGE = "wakuwaku:handler@0.5.0";
