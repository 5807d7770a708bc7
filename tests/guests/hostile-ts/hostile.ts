/**
 * A hostile TypeScript module, for the sandbox tests: each event type
 * attacks the host in one way a JavaScript engine makes easy, so the tests
 * can see the sandbox hold for componentize-js's engine as it holds for a
 * Rust module: the call fails, the other keys go on.
 *
 * | type  | tag | what its handler does                                    |
 * | ----- | --- | -------------------------------------------------------- |
 * | Spin  | 1   | loops for ever (the CPU budget ends the call)            |
 * | Hog   | 2   | allocates without end (the memory limit ends the call)   |
 * | Shout | 3   | throws an unrecoverable error with a 16 MiB message      |
 * | Note  | 4   | writes its text to state: the honest control             |
 */

import { Module, UnrecoverableError, defineEvent, t } from "wakuwaku-guest";

const byKey = (event: { key: bigint }) => event.key;

export const Spin = defineEvent({ tag: 1, name: "Spin", fields: { key: t.u64 }, key: byKey });
export const Hog = defineEvent({ tag: 2, name: "Hog", fields: { key: t.u64 }, key: byKey });
export const Shout = defineEvent({ tag: 3, name: "Shout", fields: { key: t.u64 }, key: byKey });
export const Note = defineEvent({ tag: 4, name: "Note", fields: { key: t.u64, text: t.string }, key: byKey });

const hostile = new Module("hostile");

hostile.handles(Spin, () => {
  let n = 0;
  for (;;) {
    n = (n + 1) % 1000;
  }
});

hostile.handles(Hog, (ctx) => {
  const kept: Uint8Array[] = [];
  for (let i = 0; ; i++) {
    kept.push(new Uint8Array(1 << 20).fill(i));
    if (i % 16 === 15) ctx.debug(`${kept.length} MiB`);
  }
});

hostile.handles(Shout, () => {
  throw new UnrecoverableError("x".repeat(16 << 20));
});

hostile.handles(Note, (ctx, events) => {
  for (const event of events) ctx.set("note", event.text);
});

export default hostile;
