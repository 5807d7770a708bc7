/// <reference path="./wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/timers@0.5.0' {
  /**
   * Sets the key's timer `name` at event time `at` with `payload`: a new
   * one, or the one of that name moved.
   */
  export function set(name: string, at: bigint, payload: Uint8Array): void;
  /**
   * Cancels the key's timer `name` (no error if there is none).
   */
  export function cancel(name: string): void;
  /**
   * The key's timer `name`, as this call sees it (committed, and the
   * changes of this batch).
   */
  export function get(name: string): Timer | undefined;
  export type Timer = import('wakuwaku:handler/types@0.5.0').Timer;
  export type Refusal = import('wakuwaku:handler/types@0.5.0').Refusal;
}
