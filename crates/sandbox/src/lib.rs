//! sandcall's sandbox: everything that isolates a program, and nothing else.
//!
//! Invariants:
//! - This crate never uses tokio and never starts a thread: `helper::run_helper` runs in a
//!   single-threaded process of its own (`sandcall sandbox-helper`, or forked from the
//!   single-threaded `launcher::run_launcher`), so fork and clone are safe there. The
//!   server only starts that process and talks JSON lines to it.
//! - The isolation sequence is `helper::Sandbox::build_steps` followed by
//!   `helper::init::init_setup` with `mounts::build_root` (in init) and
//!   `helper::init::exec_program_steps` (in the program), in that order;
//!   ARCHITECTURE.md explains the order.

// Request paths answer errors, they do not panic (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cgroup;
pub mod clone3;
pub mod helper;
mod io;
pub mod landlock_layer;
pub mod launcher;
pub mod mounts;
pub mod priority;
pub mod protocol;
pub mod seccomp;
pub mod tools;
mod workspace;
