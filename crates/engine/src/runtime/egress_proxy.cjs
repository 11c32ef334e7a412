// sandcall egress (docs/egress.md): Node's own fetch ignores HTTP_PROXY and HTTPS_PROXY.
// Preloaded (NODE_OPTIONS=--require) into a run granted network: when the managed npm
// runtime's undici is there, fetch goes through its EnvHttpProxyAgent, which reads them.
"use strict";
try {
  const undici = require("/node_modules/undici");
  const agent = new undici.EnvHttpProxyAgent();
  undici.setGlobalDispatcher(agent);
  globalThis.fetch = (input, init) => undici.fetch(input, { dispatcher: agent, ...init });
} catch (_) {
  // No undici: fetch has no proxy, and reaches nothing; http(s) clients that read the
  // environment still work.
}
