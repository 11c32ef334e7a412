//! Slow and idle connections: header and body timeouts, the connection cap.
