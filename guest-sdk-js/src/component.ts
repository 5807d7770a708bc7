/**
 * The bridge between the component's WIT bindings and a {@link Module}:
 * the `handler` export of world `module` (`wit/handler-0.5.wit`).
 *
 * Only the component build imports this file (its imports,
 * `wakuwaku:handler/state@0.5.0` and the others, exist only inside a
 * component): `waku build` bundles the project's main file, whose default
 * export is its module, with an entry of one line,
 *
 *     export const handler = exportHandler(module);
 *
 * and hands the bundle to componentize-js. What the bridge does:
 * - `describe` is computed once, when the bundle is evaluated at build
 *   time, and checked by the host's rules, so a module the host would
 *   refuse does not build.
 * - A {@link HandlerError} becomes the WIT `handler-error` of its class,
 *   its message cut to the host's 4 KiB.
 * - Anything else thrown is reported as **retryable**, with its name,
 *   message and where it was thrown: what the host does with a trap (a Rust
 *   panic), without losing the instance.
 * - A refusal from an import (componentize-js throws it with the WIT error
 *   as `payload`) becomes a {@link Refusal}, which the context turns into
 *   {@link Refused}.
 */

import { emit as witEmit } from "wakuwaku:handler/emit@0.5.0";
import { log as witLog } from "wakuwaku:handler/log@0.5.0";
import * as witState from "wakuwaku:handler/state@0.5.0";
import * as witTimers from "wakuwaku:handler/timers@0.5.0";
import type * as wit from "wakuwaku:handler/types@0.5.0";
import type { HostApi, Outgoing } from "./context.js";
import { errorMessage } from "./limits.js";
import type { Module, ModuleInfo } from "./module.js";
import { HandlerError, type Level, type Ordering, Refusal, type Timer } from "./types.js";

/** The error componentize-js turns into the `err` of a result: its `payload`. */
class WitError extends Error {
  constructor(readonly payload: wit.HandlerError) {
    super(payload.message);
  }
}

function refusal(error: unknown): unknown {
  const payload = (error as { payload?: unknown } | null)?.payload;
  return typeof payload === "string" ? new Refusal(payload) : error;
}

/** The host as seen from inside the component: every call is a WIT import. */
const wasmHost: HostApi = {
  get(name) {
    try {
      return witState.get(name);
    } catch (error) {
      throw refusal(error);
    }
  },
  set(name, value) {
    try {
      witState.set(name, value);
    } catch (error) {
      throw refusal(error);
    }
  },
  delete(name) {
    try {
      witState.delete(name);
    } catch (error) {
      throw refusal(error);
    }
  },
  counterAdd(name, delta) {
    try {
      witState.counterAdd(name, delta);
    } catch (error) {
      throw refusal(error);
    }
  },
  counterGet(name) {
    try {
      return witState.counterGet(name);
    } catch (error) {
      throw refusal(error);
    }
  },
  emit(message: Outgoing) {
    try {
      witEmit({ ...message });
    } catch (error) {
      throw refusal(error);
    }
  },
  log(level: Level, message: string) {
    witLog(level, message);
  },
  setTimer(name, at, payload) {
    try {
      witTimers.set(name, at, payload);
    } catch (error) {
      throw refusal(error);
    }
  },
  cancelTimer(name) {
    try {
      witTimers.cancel(name);
    } catch (error) {
      throw refusal(error);
    }
  },
  getTimer(name) {
    try {
      return witTimers.get(name);
    } catch (error) {
      throw refusal(error);
    }
  },
};

/** What something thrown that is no handler error is reported as: its name, message and where. */
function uncaught(module: Module, error: unknown): string {
  if (error instanceof Error) {
    const frame = (error.stack ?? "").split("\n").find((line) => line.trim() !== "");
    const where = frame === undefined ? "" : ` at ${frame.trim()}`;
    return `uncaught ${error.name} in module ${module.name}${where}: ${error.message}`;
  }
  return `uncaught ${typeof error} in module ${module.name}: ${String(error)}`;
}

function call<R>(module: Module, run: () => R): R {
  try {
    return run();
  } catch (error) {
    if (error instanceof HandlerError) {
      throw new WitError({ class: error.errorClass, message: errorMessage(error.message) });
    }
    throw new WitError({ class: "retryable", message: errorMessage(uncaught(module, error)) });
  }
}

/** The WIT `handler` interface of a component, calling `module`. */
export interface HandlerExport {
  describe(): ModuleInfo;
  key(tag: number, body: Uint8Array): Uint8Array;
  ordering(tag: number, body: Uint8Array): Ordering;
  eventTime(tag: number, body: Uint8Array): bigint | undefined;
  combine(tag: number, bodies: Uint8Array[]): Uint8Array;
  handle(tag: number, key: Uint8Array, bodies: Uint8Array[]): void;
  fire(key: Uint8Array, timers: Timer[]): void;
}

/** The component's `handler` export for `module`; its description is checked now. */
export function exportHandler(module: Module): HandlerExport {
  const described = module.describe();
  return {
    describe: () => described,
    key: (tag, body) => call(module, () => module.key(tag, body)),
    ordering: (tag, body) => call(module, () => module.ordering(tag, body)),
    eventTime: (tag, body) => call(module, () => module.eventTime(tag, body)),
    combine: (tag, bodies) => call(module, () => module.combine(tag, bodies)),
    handle: (tag, key, bodies) => call(module, () => module.handle(wasmHost, tag, key, bodies)),
    fire: (key, timers) => call(module, () => module.fire(wasmHost, key, timers)),
  };
}
