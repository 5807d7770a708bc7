/**
 * {{name}}: a wakuwaku handler module. It counts each user's visits (state
 * of the user's key) and all visits (a shared counter).
 *
 * Add event types with `defineEvent` (each with a tag unique in the topic)
 * and register a handler for each on the module; the file's default
 * export is the module.
 */

import { Module, defineEvent, t } from "wakuwaku-guest";

/** A user visited a page. */
export const Visited = defineEvent({
  tag: 1,
  name: "Visited",
  fields: { user: t.u64, page: t.string },
  key: (event) => event.user,
});

const module = new Module("{{module}}");

module.handles(Visited, (ctx, events) => {
  const now = (ctx.get("visits", t.int) ?? 0) + events.length;
  ctx.set("visits", now);
  ctx.counterAdd("all_visits", events.length);
  ctx.info(`${now} visits`);
});

export default module;
