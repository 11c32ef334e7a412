// sandcall's Node runner, for JavaScript and TypeScript. It runs the submitted code,
// /run/sandcall/main.mjs (an ES module, so top-level `await` and `import` work) or
// /run/sandcall/main.ts (transpiled in place by sucrase, which keeps every line where it
// was), with `require` defined as well; for programs that call tools, every declared
// tool is a global async function. In a warm sandbox, started before the code exists,
// it first waits on fd 3 for {"args": [...], "tools": bool}. The program's own file
// name and line numbers are the ones its errors show.
import fs from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import { inspect } from "node:util";
import vm from "node:vm";

const MAIN = process.env.SANDCALL_MAIN;
const TRANSPILER = process.env.SANDCALL_TYPESCRIPT;
const SOCKET = "/run/sandcall/tools.sock";
const TOOLS = "/run/sandcall/tools.json";
delete process.env.SANDCALL_MAIN;
delete process.env.SANDCALL_TYPESCRIPT;

const require = createRequire(MAIN);
// Loaded first, so that a warm sandbox has it loaded before its program arrives.
const sucrase = TRANSPILER ? require(TRANSPILER) : null;

let args = process.argv.slice(2);
let withTools = true;
if (process.env.SANDCALL_WARM === "1") {
  delete process.env.SANDCALL_WARM;
  // Bytes, decoded once whole: a character may straddle two reads.
  const chunks = [];
  for (;;) {
    const chunk = Buffer.alloc(1 << 16);
    let n = 0;
    try {
      n = fs.readSync(3, chunk, 0, chunk.length, null);
    } catch (e) {
      if (e.code === "EAGAIN") continue;
      throw e;
    }
    if (n === 0) break;
    chunks.push(chunk.subarray(0, n));
    if (chunk[n - 1] === 0x0a) break;
  }
  const line = Buffer.concat(chunks).toString("utf8");
  const start = JSON.parse(line || "{}");
  args = start.args || [];
  withTools = Boolean(start.tools);
  // fd 3 stays open: the run's end is reported there, so that sandcall need not wait
  // for the kernel to end this process.
  process.on("exit", (code) => {
    try {
      fs.writeSync(3, `exit ${code & 0xff}\n`);
    } catch {}
  });
}
process.argv = [process.argv[0], MAIN, ...args];

// A programmatic session's program draws the same numbers from Math.random when
// sandcall runs it again (replay, docs/scaling.md): seeded from /run/sandcall/seed
// (mulberry32, 32 bits of state).
if (withTools) {
  let seed = null;
  try {
    seed = Number.parseInt(fs.readFileSync("/run/sandcall/seed", "ascii"), 10);
  } catch {}
  if (Number.isInteger(seed)) {
    let state = seed >>> 0;
    Math.random = function random() {
      state = (state + 0x6d2b79f5) >>> 0;
      let t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
}

// An error nothing caught is printed here, and the process ends with status 1 as Node
// would end it; Node's own report would come after the "exit" event, which in a warm
// sandbox ends the run at once, so it could be lost. The runner's own frames are left
// out. A program that handles uncaught errors itself keeps doing so.
process.on("uncaughtException", (error) => {
  if (process.listenerCount("uncaughtException") > 1) return;
  let text;
  if (error instanceof Error && typeof error.stack === "string") {
    text = error.stack
      .split("\n")
      .filter((line) => !/^\s+at .*(\[eval1\]|runner\.mjs)/.test(line))
      .join("\n");
  } else {
    text = `Uncaught ${inspect(error)}`;
  }
  try {
    fs.writeSync(2, `${text}\n`);
  } catch {}
  process.exit(1);
});
globalThis.require = require;

/** A tool call failed: the caller answered with is_error, or sandcall refused it. */
class ToolError extends Error {
  constructor(message, kind) {
    super(message);
    this.name = "ToolError";
    this.kind = kind;
  }
}

/** The declared tools as global async functions, talking to sandcall over one socket:
 * a call is sent at once, and a "flush" when the program next waits (setImmediate),
 * so every call made until then (`await Promise.all([...])`) reaches the caller in one
 * pause. */
function defineTools(tools) {
  let socket = null;
  let nextId = 0;
  let flushing = false;
  let buffer = "";
  const pending = new Map();
  const fail = (message) => {
    for (const { reject } of pending.values()) reject(new ToolError(message, "closed"));
    pending.clear();
  };
  const connect = () => {
    socket = net.createConnection({ path: SOCKET });
    socket.setEncoding("utf8");
    socket.on("data", (data) => {
      buffer += data;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const reply = JSON.parse(buffer.slice(0, end));
        buffer = buffer.slice(end + 1);
        const waiter = pending.get(reply.id);
        if (!waiter) continue;
        pending.delete(reply.id);
        if (reply.ok) waiter.resolve(reply.result);
        else waiter.reject(new ToolError(reply.error || "tool call failed", reply.kind));
      }
      // An idle connection does not keep the program alive.
      if (pending.size === 0) socket.unref();
    });
    socket.on("error", (e) => fail(`the connection to sandcall failed: ${e.message}`));
    socket.on("close", () => fail("the connection to sandcall closed"));
  };
  const call = (name, argumentsObject, site) => {
    if (argumentsObject === undefined) argumentsObject = {};
    if (argumentsObject === null || typeof argumentsObject !== "object" || Array.isArray(argumentsObject)) {
      return Promise.reject(new TypeError(`${name}() takes one object of named arguments`));
    }
    if (socket === null) connect();
    socket.ref();
    nextId += 1;
    const id = `c${nextId}`;
    // The error a failed call rejects with points at the program's line that made
    // the call, not at the socket's reader.
    const trace = {};
    Error.captureStackTrace(trace, site);
    const promise = new Promise((resolve, reject) =>
      pending.set(id, {
        resolve,
        reject: (error) => {
          const frames = trace.stack.split("\n").slice(1).join("\n");
          error.stack = `${error.name}: ${error.message}\n${frames}`;
          reject(error);
        },
      }),
    );
    socket.write(JSON.stringify({ op: "call", id, name, arguments: argumentsObject }) + "\n");
    if (!flushing) {
      flushing = true;
      setImmediate(() => {
        flushing = false;
        socket.write('{"op":"flush"}\n');
      });
    }
    return promise;
  };
  for (const tool of tools) {
    const fn = async function (argumentsObject) {
      return call(tool.name, argumentsObject, fn);
    };
    for (const name of tool.js) {
      Object.defineProperty(fn, "name", { value: tool.js[0] });
      globalThis[name] = fn;
    }
  }
  globalThis.ToolError = ToolError;
}

if (withTools && fs.existsSync(TOOLS)) {
  defineTools(JSON.parse(fs.readFileSync(TOOLS, "utf8")));
}

if (sucrase) {
  // TypeScript: types stripped and imports made `require` calls, line for line, then run
  // inside an async function (top-level await) on the first line, so that no line moves.
  const source = fs.readFileSync(MAIN, "utf8");
  let code;
  try {
    code = sucrase.transform(source, {
      transforms: ["typescript", "imports"],
      filePath: MAIN,
    }).code;
  } catch (e) {
    const where = e.loc ? `${MAIN}:${e.loc.line}:${e.loc.column + 1}` : MAIN;
    process.stderr.write(`${where}\nSyntaxError: ${e.message}\n`);
    process.exit(1);
  }
  const module = { exports: {} };
  // The program's own block inside the function, so that it may declare names of its
  // own that the parameters also have (`const module = ...`; not `require`, which its
  // imports have become).
  const wrapped = `(async function (exports, require, module, __filename, __dirname) {"use strict";{${code}\n}})`;
  const run = vm.runInThisContext(wrapped, { filename: MAIN });
  await run(module.exports, require, module, MAIN, "/run/sandcall");
} else {
  await import(MAIN);
}
