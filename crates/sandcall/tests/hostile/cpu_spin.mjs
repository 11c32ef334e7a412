// Attacks the wall-clock and CPU budgets from JavaScript: a busy loop that never yields
// to the event loop, so no timer of its own could end it.
let n = 0;
for (;;) {
  n = (n + 1) % 1000003;
}
