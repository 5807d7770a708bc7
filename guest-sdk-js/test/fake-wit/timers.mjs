const host = () => globalThis.wakuFakeHost;
export const set = (name, at, payload) => host().call("setTimer", name, at, payload);
export const cancel = (name) => host().call("cancelTimer", name);
export const get = (name) => host().call("getTimer", name);
