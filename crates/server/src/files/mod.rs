//! The file routes (`routes`); the operations on files are the engine's
//! (`sandcall_engine::files`), re-exported here under the names the routes use.

pub mod routes;

pub use sandcall_engine::files::*;
