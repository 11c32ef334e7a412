//! One principal cannot take every session or run slot, and programmatic runs are
//! counted in admission like `/v1/exec`.
