//! POST /v1/exec/programmatic: programs that call the caller's tools. The program is
//! paused at each tool call, the caller answers over HTTP, and the token, budget,
//! timeout and cleanup rules of the wire contract hold.
//!
//! The tests, by concern: `calls` (the call-and-answer loop), `stubs` (the tools as
//! Python and Bash see them), `refusals` (schemas, budgets and sizes checked before a
//! call reaches the caller), `resume` (tokens, partial answers, retries), `timeouts`
//! (time limits and expiry), `cancel` and `workspace` (a session in a workspace). `support` holds the helpers they share.

mod calls;
mod cancel;
mod refusals;
mod resume;
mod stubs;
mod support;
mod timeouts;
mod workspace;
