// Module hooks for the component bridge's test: the component's WIT
// imports (`wakuwaku:handler/<interface>@0.5.0`), which exist only inside a
// component, resolved to fakes that call `globalThis.wakuFakeHost`.
export async function resolve(specifier, context, next) {
  const match = /^wakuwaku:handler\/([a-z-]+)@0\.5\.0$/.exec(specifier);
  if (match) {
    return { url: new URL(`./${match[1]}.mjs`, import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
