/// <reference path="./wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/state@0.5.0' {
  /**
   * Reads an entry of the current key.
   */
  export function get(name: string): Uint8Array | undefined;
  /**
   * Writes an entry of the current key.
   */
  export function set(name: string, value: Uint8Array): void;
  /**
   * Removes an entry of the current key (no error if it is absent).
   */
  export { _delete as delete };
  function _delete(name: string): void;
  /**
   * Adds `delta` to a counter shared by every key of the projection.
   */
  export function counterAdd(name: string, delta: bigint): void;
  /**
   * Reads a shared counter: its committed value plus this key's changes.
   * "Committed" is as of the batch's start: the host reads a counter
   * once per batch, so changes other keys' batches (on this host or
   * another sharing the state) commit meanwhile show from the next
   * batch on.
   */
  export function counterGet(name: string): bigint;
  export type Refusal = import('wakuwaku:handler/types@0.5.0').Refusal;
}
