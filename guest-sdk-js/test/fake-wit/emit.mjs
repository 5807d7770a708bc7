export const emit = (message) => globalThis.wakuFakeHost.call("emit", message);
