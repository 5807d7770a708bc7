/**
 * The rules and limits of the module boundary, as the host applies them
 * (`core/src/limits.rs`), for the test host.
 *
 * A handler running in the host meets these rules at every import call: a
 * value that breaks one is refused with a `refusal` naming the rule. The
 * test host (`testing.ts`) applies the same rules with the same messages,
 * so a unit test sees what production would; the suite checks them case by
 * case against the host's own tests (`test/limits.test.ts`).
 *
 * Rules kept here, as in the host:
 * - **Every refusal names its rule**: `<rule>: <what is wrong>`, where
 *   `<rule>` is a stable id (`state-value-size`, `emit-topic`, ...).
 * - **A refused value leaves nothing behind**: {@link CallTally} counts a
 *   value against the per-call limits only when it is accepted.
 * - **Counters stay in the s64 range as each key sees them.**
 * - **What a module keeps is bounded**: a projection holds at most
 *   `maxCounters` counters and a key at most `maxEntriesPerKey` entries
 *   (`counter-count`, `entries-per-key`); only a new counter or entry past
 *   the quota is refused, changing what exists never is.
 * - **Timers keep their own rules** (contract 0.5, `docs/timers.md`): a
 *   name of 1 to 128 bytes without NUL (`timer-name`), a payload within
 *   `maxTimerPayload` (`timer-payload-size`), a time below the largest s64
 *   (`timer-time`), during `fire` only later than the timers fired
 *   (`timer-at-firing`); a key holds at most `maxTimersPerKey` timers and
 *   a projection `maxTimers` (`timers-per-key`, `timers-in-all`: only a
 *   new timer past them is refused, moving or cancelling one never is).
 *   Each `set` and `cancel` counts as a state write of its name and
 *   payload.
 */

import { KeyFormatError, decodeKey } from "./key.js";
import { Refusal } from "./types.js";

/** The longest state entry or counter name, in bytes. */
export const MAX_NAME_BYTES = 256;
/** The most event types one module may declare. */
export const MAX_EVENT_TYPES = 256;
/** The longest event type name, in bytes. */
export const MAX_EVENT_TYPE_NAME_BYTES = 128;
/** The most topics one module may declare it emits to. */
export const MAX_EMIT_TOPICS = 64;
/** The longest topic name, in bytes. */
export const MAX_TOPIC_NAME_BYTES = 255;
/** The longest timer name, in bytes (`timer-name`). */
export const MAX_TIMER_NAME_BYTES = 128;
/** The longest handler-error message the host keeps, in bytes. */
export const MAX_ERROR_MESSAGE_BYTES = 4 << 10;

export const I64_MIN = -(1n << 63n);
export const I64_MAX = (1n << 63n) - 1n;

const encoder = new TextEncoder();
const lenient = new TextDecoder("utf-8");

/** The UTF-8 length of `text` (a lone surrogate counts 3 bytes, as in the host's view). */
export function utf8Length(text: string): number {
  let length = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) {
      length += 1;
    } else if (c < 0x800) {
      length += 2;
    } else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        length += 4;
        i++;
      } else {
        length += 3;
      }
    } else {
      length += 3;
    }
  }
  return length;
}

/** 1 to 255 bytes of ASCII letters, digits, `_`, `-` and `.`. */
export function isTopicName(topic: string): boolean {
  return topic.length > 0 && topic.length <= MAX_TOPIC_NAME_BYTES && /^[A-Za-z0-9_.-]+$/.test(topic);
}

/** One of the host's own topics (`retry_*`, `dlq_*`). */
export function isHostTopic(topic: string): boolean {
  return topic.startsWith("retry_") || topic.startsWith("dlq_");
}

/** 1 to 128 bytes of ASCII letters, digits, `_`, `-`, `.` and `:`. */
export function isEventTypeName(name: string): boolean {
  return name.length > 0 && name.length <= MAX_EVENT_TYPE_NAME_BYTES && /^[A-Za-z0-9_.:-]+$/.test(name);
}

/** `text` cut to at most `limit` UTF-8 bytes at a character boundary, and whether it was cut. */
function cut(text: string, limit: number): [string, boolean] {
  // Every UTF-16 unit is at least one byte: past `limit` units the text is
  // cut, and only its first `limit` units are looked at (a huge message
  // costs no more than a short one).
  if (text.length <= limit && utf8Length(text) <= limit) {
    return [text, false];
  }
  const data = encoder.encode(text.slice(0, limit)).subarray(0, limit);
  // A character cut in half is dropped whole.
  let end = data.length;
  let back = end - 1;
  while (back >= 0 && (data[back]! & 0xc0) === 0x80) {
    back--;
  }
  if (back >= 0) {
    const lead = data[back]!;
    const width = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    if (back + width > end) {
      end = back;
    }
  }
  return [lenient.decode(data.subarray(0, end)), true];
}

/** A handler-error message as the host keeps it: at most 4 KiB, marked when cut. */
export function errorMessage(message: string): string {
  const [kept, wasCut] = cut(message, MAX_ERROR_MESSAGE_BYTES);
  return wasCut ? `${kept} […cut]` : message;
}

function quoted(text: string): string {
  const [kept, wasCut] = cut(text, 64);
  return wasCut ? `${kept}…` : kept;
}

/**
 * How much a module may hand the host per value and per `handle` call, and
 * how much state it may keep; the host's defaults. Counts and bytes per
 * call count every accepted call of the import, also when it writes the
 * same entry again; refused calls count nothing.
 */
export interface PayloadLimits {
  /** Largest state value, in bytes. */
  maxStateValue: number;
  /** Most state writes (`set` and `delete`) in one call. */
  maxStateWritesPerCall: number;
  /** Most bytes of entry names and values written in one call. */
  maxStateBytesPerCall: number;
  /** Most counter changes in one call. */
  maxCounterChangesPerCall: number;
  /** Largest body a handler may emit, or `combine` may return, in bytes. */
  maxEmitBody: number;
  /** Most messages emitted in one call. */
  maxEmitsPerCall: number;
  /** Most bytes of topics, keys and bodies emitted in one call. */
  maxEmitBytesPerCall: number;
  /** Longest log line kept, in bytes; longer ones are cut and marked. */
  maxLogLine: number;
  /** Most log lines kept per call; later ones are dropped and counted. */
  maxLogLinesPerCall: number;
  /** Most distinct counters a projection holds; a new one past it is refused. */
  maxCounters: number;
  /** Most entries one key holds; a new one past it is refused. */
  maxEntriesPerKey: number;
  /** Largest payload of a timer, in bytes (`timer-payload-size`). */
  maxTimerPayload: number;
  /** Most timers one key holds; a new one past it is refused (`timers-per-key`). */
  maxTimersPerKey: number;
  /** Most timers a projection holds; a new one past it is refused (`timers-in-all`). */
  maxTimers: number;
}

/** The host's default limits. */
export const DEFAULT_LIMITS: Readonly<PayloadLimits> = Object.freeze({
  maxStateValue: 1 << 20,
  maxStateWritesPerCall: 1_000,
  maxStateBytesPerCall: 4 << 20,
  maxCounterChangesPerCall: 1_000,
  maxEmitBody: 1 << 20,
  maxEmitsPerCall: 1_000,
  maxEmitBytesPerCall: 4 << 20,
  maxLogLine: 4 << 10,
  maxLogLinesPerCall: 100,
  maxCounters: 10_000,
  maxEntriesPerKey: 1_000,
  maxTimerPayload: 1 << 10,
  maxTimersPerKey: 100,
  maxTimers: 1_000_000,
});

/** An entry or counter name is 1 to 256 bytes, without a NUL. */
export function checkName(name: string): void {
  const length = utf8Length(name);
  if (length < 1 || length > MAX_NAME_BYTES) {
    throw new Refusal(
      `name-length: an entry or counter name is 1 to ${MAX_NAME_BYTES} bytes; this one has ${length}`,
    );
  }
  const nul = name.indexOf("\0");
  if (nul >= 0) {
    throw new Refusal(
      `name-nul: an entry or counter name holds no NUL character (U+0000); this one has one at byte ${utf8Length(name.slice(0, nul))}`,
    );
  }
}

/** A change that would make counter `name` a new one while the projection holds `held`: refused at the quota. */
export function checkCounterCount(limits: PayloadLimits, name: string, held: number): void {
  if (held >= limits.maxCounters) {
    throw new Refusal(
      `counter-count: the projection holds ${held} counters (committed and pending), at most ${limits.maxCounters}; counter \`${quoted(name)}\` would be a new one`,
    );
  }
}

/** A set that would make entry `name` a new one while the key holds `held`: refused at the quota. */
export function checkEntriesPerKey(limits: PayloadLimits, name: string, held: number): void {
  if (held >= limits.maxEntriesPerKey) {
    throw new Refusal(
      `entries-per-key: this key holds ${held} entries (committed and written in this batch), at most ${limits.maxEntriesPerKey}; entry \`${quoted(name)}\` would be a new one`,
    );
  }
}

/** A timer name is 1 to 128 bytes, without a NUL (`timer-name`). */
export function checkTimerName(name: string): void {
  const length = utf8Length(name);
  if (length < 1 || length > MAX_TIMER_NAME_BYTES) {
    throw new Refusal(
      `timer-name: a timer name is 1 to ${MAX_TIMER_NAME_BYTES} bytes without NUL; this one has ${length} bytes`,
    );
  }
  const nul = name.indexOf("\0");
  if (nul >= 0) {
    throw new Refusal(
      `timer-name: a timer name is 1 to ${MAX_TIMER_NAME_BYTES} bytes without NUL; this one has a NUL at byte ${utf8Length(name.slice(0, nul))}`,
    );
  }
}

/**
 * Checks a timer `set` as a value: its name, its payload of
 * `payloadLength` bytes, its time `at`, and during `fire` at `firing`,
 * that it is later (`timer-at-firing`).
 */
export function checkTimer(
  limits: PayloadLimits,
  name: string,
  at: bigint,
  payloadLength: number,
  firing: bigint | undefined,
): void {
  checkTimerName(name);
  if (payloadLength > limits.maxTimerPayload) {
    throw new Refusal(
      `timer-payload-size: timer \`${quoted(name)}\` has a payload of ${payloadLength} bytes, over the limit of ${limits.maxTimerPayload} bytes`,
    );
  }
  if (at === I64_MAX) {
    throw new Refusal(
      `timer-time: timer \`${quoted(name)}\` is set at ${at}, the largest time, which no clock ever passes`,
    );
  }
  if (firing !== undefined && !(at > firing)) {
    throw new Refusal(
      `timer-at-firing: timer \`${quoted(name)}\` is set at ${at} while the timers at ${firing} fire; a call that fires timers sets timers only later than them`,
    );
  }
}

/** A set that would make timer `name` a new one while the key holds `held`: refused at the quota. */
export function checkTimersPerKey(limits: PayloadLimits, name: string, held: number): void {
  if (held >= limits.maxTimersPerKey) {
    throw new Refusal(
      `timers-per-key: a key holds at most ${limits.maxTimersPerKey} timers (it holds ${held}); timer \`${quoted(name)}\` would be a new one (moving or cancelling one is allowed)`,
    );
  }
}

/** A set that would make timer `name` a new one while the projection holds `held`: refused at the quota. */
export function checkTimersInAll(limits: PayloadLimits, name: string, held: number): void {
  if (held >= limits.maxTimers) {
    throw new Refusal(
      `timers-in-all: a projection holds at most ${limits.maxTimers} timers (it holds ${held}); timer \`${quoted(name)}\` would be a new one`,
    );
  }
}

/** A counter's value as a key reads it: refused when outside the s64 range. */
export function counterValue(name: string, value: bigint): bigint {
  if (value < I64_MIN || value > I64_MAX) {
    throw new Refusal(`counter-range: counter \`${name}\` is ${value}, outside the s64 range`);
  }
  return value;
}

/**
 * What one `handle` call has handed the host so far. Each method checks
 * one import call's values and, when they pass, counts them; a refused call
 * throws a {@link Refusal} and counts nothing.
 */
export class CallTally {
  stateWrites = 0;
  stateBytes = 0;
  counterChanges = 0;
  emits = 0;
  emitBytes = 0;

  /** A copy, to put back when a later check refuses. */
  copy(): CallTally {
    return Object.assign(new CallTally(), this);
  }

  /** Checks a `set` of `name` to a value of `valueLength` bytes. */
  set(limits: PayloadLimits, name: string, valueLength: number): void {
    checkName(name);
    if (valueLength > limits.maxStateValue) {
      throw new Refusal(
        `state-value-size: state value \`${name}\` has ${valueLength} bytes, over the limit of ${limits.maxStateValue} bytes`,
      );
    }
    this.write(limits, utf8Length(name) + valueLength);
  }

  /** Checks a `delete` of `name`. */
  delete(limits: PayloadLimits, name: string): void {
    checkName(name);
    this.write(limits, utf8Length(name));
  }

  /**
   * Checks a timer `set` of `name` at `at` with a payload of
   * `payloadLength` bytes (during `fire` at `firing`): the timer's own
   * rules ({@link checkTimer}), then as a state write of its name and
   * payload.
   */
  timerSet(limits: PayloadLimits, name: string, at: bigint, payloadLength: number, firing: bigint | undefined): void {
    checkTimer(limits, name, at, payloadLength, firing);
    this.write(limits, utf8Length(name) + payloadLength);
  }

  /** Checks a timer `cancel` of `name`: a state write of its name. */
  timerCancel(limits: PayloadLimits, name: string): void {
    checkTimerName(name);
    this.write(limits, utf8Length(name));
  }

  private write(limits: PayloadLimits, size: number): void {
    if (this.stateWrites >= limits.maxStateWritesPerCall) {
      throw new Refusal(
        `state-writes-per-call: one call may write (set or delete) at most ${limits.maxStateWritesPerCall} entries`,
      );
    }
    const would = this.stateBytes + size;
    if (would > limits.maxStateBytesPerCall) {
      throw new Refusal(
        `state-bytes-per-call: one call may write at most ${limits.maxStateBytesPerCall} bytes of names and values; this write would make ${would}`,
      );
    }
    this.stateWrites += 1;
    this.stateBytes = would;
  }

  /** Checks adding `delta` to counter `name`, at `current` as the key sees it; returns the value after. */
  counterAdd(limits: PayloadLimits, name: string, current: bigint, delta: bigint): bigint {
    checkName(name);
    if (this.counterChanges >= limits.maxCounterChangesPerCall) {
      throw new Refusal(
        `counter-changes-per-call: one call may change counters at most ${limits.maxCounterChangesPerCall} times`,
      );
    }
    const after = current + delta;
    if (after < I64_MIN || after > I64_MAX) {
      throw new Refusal(
        `counter-range: counter \`${name}\` is ${current} as this key sees it; adding ${delta} leaves the s64 range`,
      );
    }
    this.counterChanges += 1;
    return after;
  }

  /** Checks an emit of `body` with key bytes `key` to `topic`, which must be among `declared`. */
  emit(
    limits: PayloadLimits,
    declared: readonly string[],
    topic: string,
    key: Uint8Array,
    body: Uint8Array,
  ): void {
    if (!declared.includes(topic)) {
      const listed = declared.length > 0 ? declared.join(", ") : "none";
      throw new Refusal(
        `emit-topic: \`${quoted(topic)}\` is not among the topics the module declared in \`module-info.emits\` (${listed})`,
      );
    }
    if (body.length < 1 || body.length > limits.maxEmitBody) {
      throw new Refusal(
        `emit-body-size: an emitted body is 1 to ${limits.maxEmitBody} bytes; this one has ${body.length}`,
      );
    }
    try {
      decodeKey(key);
    } catch (error) {
      if (error instanceof KeyFormatError) {
        throw new Refusal(`emit-key: the message's key is not canonical: ${error.message}`);
      }
      throw error;
    }
    if (this.emits >= limits.maxEmitsPerCall) {
      throw new Refusal(`emits-per-call: one call may emit at most ${limits.maxEmitsPerCall} messages`);
    }
    const would = this.emitBytes + utf8Length(topic) + key.length + body.length;
    if (would > limits.maxEmitBytesPerCall) {
      throw new Refusal(
        `emit-bytes-per-call: one call may emit at most ${limits.maxEmitBytesPerCall} bytes of topics, keys and bodies; this message would make ${would}`,
      );
    }
    this.emits += 1;
    this.emitBytes = would;
  }
}

/** The log lines of one call: each cut to the line limit, at most the per-call count, the rest counted. */
export class LogTally {
  lines = 0;
  dropped = 0;

  /** The line to keep for `message` (cut and marked when long), or `undefined` past the count. */
  admit(limits: PayloadLimits, message: string): string | undefined {
    if (this.lines >= limits.maxLogLinesPerCall) {
      this.dropped += 1;
      return undefined;
    }
    this.lines += 1;
    const [kept, wasCut] = cut(message, limits.maxLogLine);
    return wasCut ? `${kept} […cut]` : kept;
  }

  /** Ends a call: the closing line saying how many lines were dropped, if any. */
  finish(limits: PayloadLimits): string | undefined {
    const dropped = this.dropped;
    this.lines = 0;
    this.dropped = 0;
    if (dropped === 0) {
      return undefined;
    }
    return `log-lines-per-call: ${dropped} more log lines of this call dropped (at most ${limits.maxLogLinesPerCall} per call)`;
  }
}

/**
 * A value a module's export returned that the host cannot use (a bad
 * `describe` answer, a key that is not canonical, an empty combined body),
 * naming the rule it broke.
 */
export class ContractError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ContractError";
  }

  /** The id of the rule broken, e.g. `event-type-tag`. */
  get rule(): string {
    return this.message.split(":", 1)[0]!;
  }
}

/** One event type as `describe` lists it, for {@link checkDescription}. */
export interface DescribedType {
  tag: number;
  name: string;
  maxBatch: number;
}

/** The tag no module may declare: the host's for the dead letters of timers (`core/src/limits.rs`'s `RESERVED_TAG`). */
export const RESERVED_TAG = 4294967295;

/**
 * Checks what `describe` returns: 1 to 256 event types, tags unique, names
 * valid, none the {@link RESERVED_TAG}, max batch at least 1; the emit
 * topics as {@link checkEmits}.
 */
export function checkDescription(eventTypes: readonly DescribedType[], emits: readonly string[]): void {
  if (eventTypes.length < 1 || eventTypes.length > MAX_EVENT_TYPES) {
    throw new ContractError(
      `event-type-count: a module handles 1 to ${MAX_EVENT_TYPES} event types; this one declares ${eventTypes.length}`,
    );
  }
  const tags = new Set<number>();
  for (const { tag, name, maxBatch } of eventTypes) {
    if (tags.has(tag)) {
      throw new ContractError(`event-type-tag: tag ${tag} is declared twice`);
    }
    tags.add(tag);
    if (!isEventTypeName(name)) {
      throw new ContractError(
        `event-type-name: tag ${tag} is named \`${quoted(name)}\`; a name is 1 to ${MAX_EVENT_TYPE_NAME_BYTES} bytes of letters, digits, \`_\`, \`-\`, \`.\` and \`:\``,
      );
    }
    if (tag === RESERVED_TAG) {
      throw new ContractError(
        `event-type-tag-reserved: event type \`${name}\` declares tag ${RESERVED_TAG}, which the host reserves for the dead letters of timers; give it another tag`,
      );
    }
    if (maxBatch === 0) {
      throw new ContractError(`max-batch: event type \`${name}\` declares max-batch 0 (it must be at least 1)`);
    }
  }
  checkEmits(emits);
}

/** Checks the emit topics: at most 64, each a topic name, none of the host's own, none twice. */
export function checkEmits(emits: readonly string[]): void {
  if (emits.length > MAX_EMIT_TOPICS) {
    throw new ContractError(
      `emit-topic-count: a module declares at most ${MAX_EMIT_TOPICS} emit topics; this one declares ${emits.length}`,
    );
  }
  emits.forEach((topic, index) => {
    if (!isTopicName(topic)) {
      throw new ContractError(
        `emit-topic-name: \`${quoted(topic)}\` is not a topic name (1 to ${MAX_TOPIC_NAME_BYTES} bytes of letters, digits, \`_\`, \`-\` and \`.\`)`,
      );
    }
    if (isHostTopic(topic)) {
      throw new ContractError(
        `emit-topic-host-owned: \`${topic}\` is the host's own (modules never write to \`retry_*\` or \`dlq_*\` topics)`,
      );
    }
    if (emits.slice(0, index).includes(topic)) {
      throw new ContractError(`emit-topic-duplicate: \`${topic}\` is declared twice`);
    }
  });
}

/** Checks a key the module's `key` export returned. */
export function checkKey(key: Uint8Array): void {
  try {
    decodeKey(key);
  } catch (error) {
    if (error instanceof KeyFormatError) {
      throw new ContractError(`key-canonical: the key the module returned is not canonical: ${error.message}`);
    }
    throw error;
  }
}

/** Checks a body `combine` returned: 1 byte to the emit body limit. */
export function checkCombinedBody(limits: PayloadLimits, body: Uint8Array): void {
  if (body.length < 1 || body.length > limits.maxEmitBody) {
    throw new ContractError(
      `combine-body-size: \`combine\` returns a body of 1 to ${limits.maxEmitBody} bytes; this one has ${body.length}`,
    );
  }
}
