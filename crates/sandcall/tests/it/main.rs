//! sandcall's integration tests: each test starts the real `sandcall serve` binary on a
//! free port, as root, and talks HTTP to it. Hostile programs live in `tests/hostile/`.

mod bounded_work;
mod common;
mod compiled;
mod durable;
mod errors;
mod exec;
mod faults;
mod files;
mod hostile;
mod jwt;
mod leaks;
mod lifecycle;
mod node;
mod npm;
mod openapi;
mod principals;
mod programmatic;
mod readme;
mod runtime;
mod soak;
mod unprivileged;
mod warm;
mod zygote;
