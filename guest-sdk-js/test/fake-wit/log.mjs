export const log = (level, message) => globalThis.wakuFakeHost.call("log", level, message);
