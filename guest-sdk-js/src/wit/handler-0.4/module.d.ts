/// <reference path="./interfaces/wakuwaku-handler-emit.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-handler.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-log.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-state.d.ts" />
/// <reference path="./interfaces/wakuwaku-handler-types.d.ts" />
declare module 'wakuwaku:handler/module@0.4.0' {
  export type * as WakuwakuHandlerEmit040 from 'wakuwaku:handler/emit@0.4.0'; // import wakuwaku:handler/emit@0.4.0
  export type * as WakuwakuHandlerLog040 from 'wakuwaku:handler/log@0.4.0'; // import wakuwaku:handler/log@0.4.0
  export type * as WakuwakuHandlerState040 from 'wakuwaku:handler/state@0.4.0'; // import wakuwaku:handler/state@0.4.0
  export type * as WakuwakuHandlerTypes040 from 'wakuwaku:handler/types@0.4.0'; // import wakuwaku:handler/types@0.4.0
  export * as handler from 'wakuwaku:handler/handler@0.4.0'; // export wakuwaku:handler/handler@0.4.0
}
