/// <reference path="./interfaces/wakuwaku-handler-emit.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-handler.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-log.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-state.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-timers.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/module@0.5.0' {
  export type * as WakuwakuHandlerEmit050 from 'wakuwaku:handler/emit@0.5.0'; // import wakuwaku:handler/emit@0.5.0
  export type * as WakuwakuHandlerLog050 from 'wakuwaku:handler/log@0.5.0'; // import wakuwaku:handler/log@0.5.0
  export type * as WakuwakuHandlerState050 from 'wakuwaku:handler/state@0.5.0'; // import wakuwaku:handler/state@0.5.0
  export type * as WakuwakuHandlerTimers050 from 'wakuwaku:handler/timers@0.5.0'; // import wakuwaku:handler/timers@0.5.0
  export type * as WakuwakuHandlerTypes050 from 'wakuwaku:handler/types@0.5.0'; // import wakuwaku:handler/types@0.5.0
  export * as handler from 'wakuwaku:handler/handler@0.5.0'; // export wakuwaku:handler/handler@0.5.0
}
