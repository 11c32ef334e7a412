//! sandcall's integration tests: each test starts the real `sandcall serve` binary on a
//! free port, as root, and talks HTTP to it. Hostile programs live in `tests/hostile/`.

mod audit;
mod bounded_work;
mod cluster;
mod common;
mod compiled;
mod durable;
mod egress;
mod egress_secrets;
mod errors;
mod exec;
mod faults;
mod files;
mod gvisor;
mod hostile;
mod jwt;
mod launcher;
mod leaks;
mod lifecycle;
mod metrics;
mod node;
mod npm;
mod openapi;
mod principals;
mod profiles;
mod programmatic;
mod rate_limits;
mod readme;
mod runtime;
mod s3;
mod soak;
mod unprivileged;
mod warm;
mod workspaces;
mod zygote;
