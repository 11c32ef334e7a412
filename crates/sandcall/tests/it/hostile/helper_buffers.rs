//! Work the host-side helper does for a run outside the run's cgroup: its buffers and
//! its CPU on refused calls are bounded.
