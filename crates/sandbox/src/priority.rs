//! The CPU priority of sandboxes built ahead of requests (`Prepare::background`).
//!
//! A warm pool's refill, and a template's forks, run at nice 19 while they wait, so that
//! on a busy machine the work of rebuilding yields to the runs in flight (their helper,
//! their program, the server). When a sandbox's `Run` arrives, its helper raises itself
//! and every thread of the run's cgroup back to the server's own nice value
//! (`Prepare::nice`) before the program's go: a run's program always runs at the
//! priority a cold run's does, never above the server's.
//!
//! Raising a priority again needs `CAP_SYS_NICE`; without it the helper never lowers
//! one, so that no run could be left at nice 19.

use std::collections::HashSet;

/// The nice value of background work.
pub const BACKGROUND_NICE: i32 = 19;

/// Whether this process may raise a priority it lowered (`CAP_SYS_NICE`).
pub fn can_restore() -> bool {
    caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SYS_NICE).unwrap_or(false)
}

/// Sets the nice value of thread `tid` (0: the calling thread).
pub fn set_nice(tid: i32, nice: i32) -> std::io::Result<()> {
    // SAFETY: a plain system call on integers.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The nice value of thread `tid` (0: the calling thread).
pub fn nice_of(tid: i32) -> std::io::Result<i32> {
    // getpriority can return -1 as a value: errno tells the two apart.
    // SAFETY: errno is this thread's own; __errno_location returns a valid pointer to it.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority is a plain system call on integers.
    let value = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    let err = std::io::Error::last_os_error();
    if value == -1 && err.raw_os_error().unwrap_or(0) != 0 {
        Err(err)
    } else {
        Ok(value)
    }
}

/// Puts the calling thread (the helper, which is single-threaded) and every thread that
/// `threads` lists back at nice `normal`. `threads` is read again until it names no thread
/// not already raised, so a thread started meanwhile by one not yet raised is caught too.
/// Returns the threads that could not be raised (gone ones are not counted).
pub fn restore(normal: i32, mut threads: impl FnMut() -> Vec<i32>) -> Vec<(i32, std::io::Error)> {
    let mut failed = Vec::new();
    if let Err(e) = set_nice(0, normal) {
        failed.push((0, e));
    }
    let mut done: HashSet<i32> = HashSet::new();
    for _ in 0..4 {
        let fresh: Vec<i32> = threads().into_iter().filter(|t| !done.contains(t)).collect();
        if fresh.is_empty() {
            break;
        }
        for tid in fresh {
            done.insert(tid);
            match set_nice(tid, normal) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => failed.push((tid, e)),
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_raises_the_caller_and_every_listed_thread() {
        assert!(
            can_restore(),
            "needs CAP_SYS_NICE, as the helper does: run the tests as root"
        );
        // Back to where the test started (a test runner may itself run under `nice`).
        let normal = nice_of(0).unwrap();
        // A child process (a thread id of its own) lowered as background work is.
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tid = child.id() as i32;
        set_nice(tid, BACKGROUND_NICE).unwrap();
        set_nice(0, BACKGROUND_NICE).unwrap();
        assert_eq!(
            (nice_of(0).unwrap(), nice_of(tid).unwrap()),
            (BACKGROUND_NICE, BACKGROUND_NICE)
        );
        // Listed twice over, plus one that is gone: raised once, nothing fails.
        let mut calls = 0;
        let failed = restore(normal, || {
            calls += 1;
            vec![tid, tid, 999_999_999]
        });
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!((nice_of(0).unwrap(), nice_of(tid).unwrap()), (normal, normal));
        assert_eq!(calls, 2, "the list is read again until it names nothing new");
        let _ = child.kill();
        let _ = child.wait();
    }
}
