//! sandcall's integration tests: each test starts the real `sandcall serve` binary on a
//! free port, as root, and talks HTTP to it. Hostile programs live in `tests/hostile/`.

mod bounded_work;
mod common;
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
mod openapi;
mod principals;
mod programmatic;
mod runtime;
mod soak;
mod unprivileged;
mod warm;
