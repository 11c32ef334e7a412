//! Bytes per pause and per session: what a paused session holds in the server is
//! bounded by config.
