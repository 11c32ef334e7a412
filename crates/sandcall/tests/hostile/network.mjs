// Attacks the network isolation from JavaScript: a TCP connection to a public address,
// a DNS lookup and an HTTP fetch. Prints each outcome as JSON; the sandbox's network
// namespace has only a down loopback, so each must fail.
import dns from "node:dns/promises";
import net from "node:net";

const outcome = {};
outcome.connect = await new Promise((resolve) => {
  const socket = net.connect({ host: "1.1.1.1", port: 80, timeout: 2000 });
  socket.once("connect", () => resolve("connected"));
  socket.once("timeout", () => resolve("timeout"));
  socket.once("error", (e) => resolve(e.code || String(e)));
});
try {
  await dns.lookup("example.com");
  outcome.dns = "resolved";
} catch (e) {
  outcome.dns = e.code || String(e);
}
try {
  await fetch("http://1.1.1.1/", { signal: AbortSignal.timeout(2000) });
  outcome.fetch = "fetched";
} catch (e) {
  outcome.fetch = String(e.cause?.code || e.name);
}
console.log(JSON.stringify(outcome));
process.exit(0);
