// Attacks the pids limit (max_processes) from JavaScript: spawns children through
// child_process until the kernel refuses, each child a shell that sleeps, so nothing
// ends by itself. Prints what it managed as JSON, then waits: the run must end at its
// timeout with every child reclaimed.
import { spawn } from "node:child_process";

let spawned = 0;
let error = null;
while (spawned < 10000) {
  try {
    const child = spawn("/bin/sh", ["-c", "sleep 1000"], { stdio: "ignore" });
    const failed = await new Promise((resolve) => {
      child.once("spawn", () => resolve(null));
      child.once("error", (e) => resolve(e));
    });
    if (failed) {
      error = failed.code;
      break;
    }
    spawned += 1;
  } catch (e) {
    error = e.code || String(e);
    break;
  }
}
console.log(JSON.stringify({ spawned, error }));
setInterval(() => {}, 1000);
