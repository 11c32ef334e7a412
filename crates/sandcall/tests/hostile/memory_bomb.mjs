// Attacks the memory limit from JavaScript: allocates 16 MiB buffers outside V8's heap
// (so V8's own heap limit does not stop it first) and touches every page, until the
// cgroup's memory.max kills the run.
const held = [];
for (;;) {
  const chunk = Buffer.alloc(16 << 20);
  chunk.fill(1);
  held.push(chunk);
}
