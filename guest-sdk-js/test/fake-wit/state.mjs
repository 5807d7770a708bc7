const host = () => globalThis.wakuFakeHost;
export const get = (name) => host().call("get", name);
export const set = (name, value) => host().call("set", name, value);
const remove = (name) => host().call("delete", name);
export { remove as delete };
export const counterAdd = (name, delta) => host().call("counterAdd", name, delta);
export const counterGet = (name) => host().call("counterGet", name);
