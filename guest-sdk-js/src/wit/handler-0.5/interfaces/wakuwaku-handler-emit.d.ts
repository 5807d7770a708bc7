/// <reference path="./wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/emit@0.5.0' {
  /**
   * Queues a message.
   */
  export function emit(message: Outgoing): void;
  export type Outgoing = import('wakuwaku:handler/types@0.5.0').Outgoing;
  export type Refusal = import('wakuwaku:handler/types@0.5.0').Refusal;
}
