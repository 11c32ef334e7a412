//! Per-run cgroups on v1 and v2: detection, creation with limits, accounting, removal.
//!
//! This module only touches cgroupfs files under the directories it is given, so tests and
//! non-standard hosts can point it anywhere. It never kills anything but the processes
//! listed in a cgroup it owns.

use crate::protocol::{CgroupPlacement, Limits};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where run cgroups are created: detected once by the server at start.
#[derive(Debug, Clone, PartialEq)]
pub enum CgroupRoot {
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    V2 {
        base: PathBuf,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: need cgroup v2 with the memory and pids controllers, or cgroup v1 with memory and pids mounted")]
    NotFound,
    #[error("cgroup {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A cgroup filesystem mount read from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq)]
struct CgroupMount {
    path: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split(' ').nth(4);
        let mut right = right.split(' ');
        let (fstype, _source, options) = (right.next(), right.next(), right.next());
        let (Some(mount_point), Some(fstype)) = (mount_point, fstype) else {
            continue;
        };
        let path = PathBuf::from(unescape_mountinfo(mount_point));
        match fstype {
            "cgroup2" => mounts.push(CgroupMount {
                path,
                v2: true,
                controllers: Vec::new(),
            }),
            "cgroup" => {
                let controllers = options
                    .unwrap_or("")
                    .split(',')
                    .filter(|o| !o.contains('=') && !matches!(*o, "rw" | "ro"))
                    .map(str::to_owned)
                    .collect();
                mounts.push(CgroupMount {
                    path,
                    v2: false,
                    controllers,
                });
            }
            _ => {}
        }
    }
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

impl CgroupRoot {
    /// Finds the hierarchy to use, preferring v2 when its memory and pids controllers are
    /// available. `instance` names this server's own subtree (one per data dir), so that
    /// several servers on a machine never touch each other's cgroups.
    pub fn detect(instance: &str) -> Result<Self, CgroupError> {
        let text = fs::read_to_string("/proc/self/mountinfo").map_err(io_err(Path::new("/proc/self/mountinfo")))?;
        let mounts = parse_mountinfo(&text);
        if let Some(v2) = mounts.iter().find(|m| m.v2) {
            let controllers = fs::read_to_string(v2.path.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                return Ok(CgroupRoot::V2 {
                    base: v2.path.join(instance),
                });
            }
        }
        let v1 = |name: &str| {
            mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == name))
                .map(|m| m.path.join(instance))
        };
        match (v1("memory"), v1("pids")) {
            (Some(memory), Some(pids)) => Ok(CgroupRoot::V1 {
                memory,
                pids,
                cpu: v1("cpu"),
                cpuacct: v1("cpuacct"),
            }),
            _ => Err(CgroupError::NotFound),
        }
    }

    /// Uses an explicitly configured v2 directory (a delegated subtree, for example).
    pub fn v2_at(base: PathBuf) -> Self {
        CgroupRoot::V2 { base }
    }

    pub fn version(&self) -> &'static str {
        match self {
            CgroupRoot::V1 { .. } => "v1",
            CgroupRoot::V2 { .. } => "v2",
        }
    }

    /// The instance directories, one per hierarchy.
    pub fn bases(&self) -> Vec<PathBuf> {
        match self {
            CgroupRoot::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let mut v = vec![memory.clone(), pids.clone()];
                v.extend(cpu.iter().cloned());
                v.extend(cpuacct.iter().cloned());
                v.dedup();
                v
            }
            CgroupRoot::V2 { base } => vec![base.clone()],
        }
    }

    /// Creates the instance directories (and on v2 enables the controllers for them).
    pub fn ensure(&self) -> Result<(), CgroupError> {
        for base in self.bases() {
            fs::create_dir_all(&base).map_err(io_err(&base))?;
        }
        if let CgroupRoot::V2 { base } = self {
            // Controllers must be enabled in every ancestor's subtree_control for the
            // run cgroups below `base` to get them.
            if let Some(parent) = base.parent() {
                enable_v2_controllers(parent)?;
            }
            enable_v2_controllers(base)?;
        }
        Ok(())
    }

    /// Where the cgroup of run `run_id` lives.
    pub fn placement(&self, run_id: &str) -> CgroupPlacement {
        match self {
            CgroupRoot::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => CgroupPlacement::V1 {
                memory: memory.join(run_id),
                pids: pids.join(run_id),
                cpu: cpu.as_ref().map(|p| p.join(run_id)),
                cpuacct: cpuacct.as_ref().map(|p| p.join(run_id)),
            },
            CgroupRoot::V2 { base } => CgroupPlacement::V2 {
                path: base.join(run_id),
            },
        }
    }

    /// Where the cgroup of template `template_id` lives (`Prepare::template`). On v2, a
    /// leaf (`template`) of a directory of its own that also holds the cgroups of the
    /// runs forked from it (`forked_placement`): the kernel lets the template clone a
    /// run straight into its cgroup only if it may write `cgroup.procs` of the common
    /// ancestor of both cgroups, and that directory is the one it is given
    /// (`RunCgroup::create_template`). On v1, a run cgroup like any other.
    pub fn template_placement(&self, template_id: &str) -> CgroupPlacement {
        match self {
            CgroupRoot::V2 { base } => CgroupPlacement::V2 {
                path: base.join(template_id).join(TEMPLATE_LEAF),
            },
            CgroupRoot::V1 { .. } => self.placement(template_id),
        }
    }

    /// Where the cgroup of run `run_id`, forked from template `template_id`, lives: on
    /// v2 beside the template's (`template_placement`), on v1 where any run's does.
    pub fn forked_placement(&self, template_id: &str, run_id: &str) -> CgroupPlacement {
        match self {
            CgroupRoot::V2 { base } => CgroupPlacement::V2 {
                path: base.join(template_id).join(run_id),
            },
            CgroupRoot::V1 { .. } => self.placement(run_id),
        }
    }

    /// Removes every run cgroup left under this instance by an earlier server (one that
    /// crashed or was killed), killing whatever still runs in them, and a template's
    /// directory with the runs below it. Returns how many cgroups it removed.
    pub fn sweep(&self) -> usize {
        self.bases()
            .iter()
            .map(|base| {
                subdirectories(base)
                    .iter()
                    .map(|dir| remove_tree(dir, Duration::from_secs(2)))
                    .sum::<usize>()
            })
            .sum()
    }

    /// At a clean stop: sweeps, then removes the instance directories themselves, so a
    /// stopped server leaves no cgroup behind (each left directory of a hierarchy is a
    /// task group the kernel keeps walking: writing a run's `cpu.cfs_quota_us` walks
    /// them all). Returns how many run cgroups the sweep found.
    pub fn close(&self) -> usize {
        let swept = self.sweep();
        for base in self.bases() {
            // One still busy (a process that outlived the sweep's kill) stays.
            let _ = fs::remove_dir(&base);
        }
        swept
    }

    /// Cgroups currently present under this instance, at any depth (for leak
    /// accounting).
    pub fn count_runs(&self) -> usize {
        fn count(dir: &Path) -> usize {
            subdirectories(dir).iter().map(|d| 1 + count(d)).sum()
        }
        self.bases().iter().map(|b| count(b)).sum()
    }
}

/// The leaf that holds a template on v2, in the directory its runs' cgroups share.
const TEMPLATE_LEAF: &str = "template";

/// The directories (child cgroups) in `dir`; none if it cannot be read.
fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Kills every process in the cgroup `dir` and below, and removes the cgroups, the
/// deepest first. Returns how many it removed.
fn remove_tree(dir: &Path, wait: Duration) -> usize {
    kill_all(dir);
    let below: usize = subdirectories(dir).iter().map(|d| remove_tree(d, wait)).sum();
    below + usize::from(remove_when_empty(dir, wait).is_ok())
}

fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = fs::read_to_string(dir.join("cgroup.controllers")).map_err(io_err(dir))?;
    for c in ["memory", "pids", "cpu"] {
        if available.split_whitespace().any(|x| x == c) {
            let file = dir.join("cgroup.subtree_control");
            // Already enabled is fine; a failure for "cpu" (realtime tasks present) is
            // tolerated, memory and pids are required.
            if let Err(e) = fs::write(&file, format!("+{c}")) {
                if c != "cpu" {
                    return Err(CgroupError::Io { path: file, source: e });
                }
            }
        }
    }
    Ok(())
}

/// Gives `owner` the cgroup's `cgroup.procs`, and nothing else of it. Where it cannot
/// (a server without root, in a subtree delegated to it, names the sandbox's ids in a
/// user namespace of its own), the file stays as it is: the template's clone into the
/// cgroup is then refused, and the run's helper moves the run instead, as on v1
/// (`Event::Ready::cloned_into_cgroup` says which).
fn give_procs(dir: &Path, (uid, gid): (u32, u32)) {
    let _ = std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(uid), Some(gid));
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(io_err(&path))
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Value of `key` in a flat-keyed file such as memory.events or cpu.stat.
fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Sends SIGKILL to every process listed in a cgroup.
fn kill_all(dir: &Path) {
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// rmdir of a cgroup fails with EBUSY until its last process has exited; killed
/// processes take a moment to go.
fn remove_when_empty(dir: &Path, wait: Duration) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() >= wait => {
                return Err(CgroupError::Io {
                    path: dir.to_path_buf(),
                    source: e,
                })
            }
            Err(_) => {
                kill_all(dir);
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// Watches a cgroup from outside while its processes run (a gVisor sandbox's host
/// cgroup): whether its memory limit was reached, and a way to kill what runs in it.
/// Holds paths only; the `RunCgroup` it came from still owns the cgroup.
#[derive(Debug, Clone)]
pub struct CgroupWatch {
    placement: CgroupPlacement,
}

impl CgroupWatch {
    /// The memory limit was reached at least once: an allocation had to wait for
    /// reclaim or failed (v1 `memory.failcnt`, v2 `memory.events` `max`), or the kernel
    /// killed a process for it (`oom_kill`; on v1 the only sign, where a charge that
    /// ends in the OOM killer is not counted as a failure).
    pub fn memory_limit_hit(&self) -> bool {
        let (hits, kills) = self.memory_events();
        hits > 0 || kills > 0
    }

    /// How many times the memory limit was reached, and how many processes the kernel
    /// killed for it.
    fn memory_events(&self) -> (u64, u64) {
        let (hits, kills) = match &self.placement {
            CgroupPlacement::V1 { memory, .. } => (
                read_u64(&memory.join("memory.failcnt")),
                read_keyed(&memory.join("memory.oom_control"), "oom_kill"),
            ),
            CgroupPlacement::V2 { path } => {
                let events = path.join("memory.events");
                (read_keyed(&events, "max"), read_keyed(&events, "oom_kill"))
            }
        };
        (hits.unwrap_or(0), kills.unwrap_or(0))
    }

    /// Whether the cgroup is still there.
    pub fn exists(&self) -> bool {
        match &self.placement {
            CgroupPlacement::V1 { memory, .. } => memory.is_dir(),
            CgroupPlacement::V2 { path } => path.is_dir(),
        }
    }

    /// Kills every process in the cgroup.
    pub fn kill(&self) {
        let dir = match &self.placement {
            CgroupPlacement::V1 { pids, .. } => pids,
            CgroupPlacement::V2 { path } => path,
        };
        kill_all(dir);
    }
}

/// One run's cgroup, created with its limits.
#[derive(Debug)]
pub struct RunCgroup {
    placement: CgroupPlacement,
    /// On v2, a template's or a forked run's: the directory the template's cgroup
    /// shares with its runs', removed with the last of them.
    family: Option<PathBuf>,
}

/// What the kernel accounted for a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_time_ms: u64,
    pub memory_peak_bytes: u64,
    pub oom_killed: bool,
    /// The memory limit was reached at least once (an allocation had to wait for
    /// reclaim, or failed).
    pub memory_limit_hit: bool,
}

impl RunCgroup {
    pub fn create(placement: &CgroupPlacement, limits: &Limits) -> Result<Self, CgroupError> {
        let cg = RunCgroup {
            placement: placement.clone(),
            family: None,
        };
        for dir in cg.dirs() {
            fs::create_dir(&dir).map_err(io_err(&dir))?;
        }
        let mem = limits.memory_bytes.to_string();
        let quota = (limits.cpus * 100_000.0).round().max(1000.0) as u64;
        match placement {
            CgroupPlacement::V1 { memory, pids, cpu, .. } => {
                write(memory, "memory.limit_in_bytes", &mem)?;
                // memsw exists only with swap accounting; without it there is no swap to use.
                if memory.join("memory.memsw.limit_in_bytes").exists() {
                    write(memory, "memory.memsw.limit_in_bytes", &mem)?;
                }
                let _ = write(memory, "memory.swappiness", "0");
                write(pids, "pids.max", &limits.max_processes.to_string())?;
                if let Some(cpu) = cpu {
                    write(cpu, "cpu.cfs_period_us", "100000")?;
                    write(cpu, "cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
            CgroupPlacement::V2 { path } => {
                write(path, "memory.max", &mem)?;
                if path.join("memory.swap.max").exists() {
                    write(path, "memory.swap.max", "0")?;
                }
                write(path, "pids.max", &limits.max_processes.to_string())?;
                if path.join("cpu.max").exists() {
                    write(path, "cpu.max", &format!("{quota} 100000"))?;
                }
            }
        }
        Ok(cg)
    }

    /// Gives the cgroup the CPU weight of work that waits for a request (`background`:
    /// the lowest there is), or the default back. Unlike a nice value, the weight also
    /// holds for the processes and threads started in the cgroup later. Nothing where
    /// the cgroup has no CPU controller.
    pub fn set_cpu_weight(&self, background: bool) -> Result<(), CgroupError> {
        match &self.placement {
            CgroupPlacement::V1 { cpu: Some(cpu), .. } => {
                write(cpu, "cpu.shares", if background { "2" } else { "1024" })
            }
            CgroupPlacement::V2 { path } if path.join("cpu.weight").exists() => {
                write(path, "cpu.weight", if background { "1" } else { "100" })
            }
            _ => Ok(()),
        }
    }

    /// A template's cgroup (`CgroupRoot::template_placement`). On v2, it first makes
    /// the directory the template shares with its runs, with the controllers on for
    /// them, and gives `owner` (the sandbox's host uid and gid) its `cgroup.procs`: with
    /// that and each run's own `cgroup.procs` (`create_forked`), the template may
    /// clone each run straight into the run's cgroup. It gets no other file: the
    /// limits stay root's. A run cannot use this: it has no cgroup filesystem, and one
    /// it mounted would be rooted at its own cgroup (ARCHITECTURE.md, "Forked runs").
    pub fn create_template(
        placement: &CgroupPlacement,
        limits: &Limits,
        owner: (u32, u32),
    ) -> Result<Self, CgroupError> {
        let Some(family) = Self::family_of(placement) else {
            return Self::create(placement, limits);
        };
        fs::create_dir(&family).map_err(io_err(&family))?;
        give_procs(&family, owner);
        let made = enable_v2_controllers(&family).and_then(|()| Self::create(placement, limits));
        match made {
            Ok(cg) => Ok(RunCgroup {
                family: Some(family),
                ..cg
            }),
            Err(e) => {
                let _ = fs::remove_dir(&family);
                Err(e)
            }
        }
    }

    /// A run forked from a template (`CgroupRoot::forked_placement`). On v2 its
    /// `cgroup.procs` is given to `owner`, so that the template may clone the run
    /// into it (`create_template`).
    pub fn create_forked(placement: &CgroupPlacement, limits: &Limits, owner: (u32, u32)) -> Result<Self, CgroupError> {
        let family = Self::family_of(placement);
        let cg = RunCgroup {
            family,
            ..Self::create(placement, limits)?
        };
        if let Some(path) = cg.v2_path() {
            give_procs(path, owner);
        }
        Ok(cg)
    }

    fn family_of(placement: &CgroupPlacement) -> Option<PathBuf> {
        match placement {
            CgroupPlacement::V2 { path } => path.parent().map(Path::to_path_buf),
            CgroupPlacement::V1 { .. } => None,
        }
    }

    /// The cgroup v2 directory a template may clone this run into, if any.
    pub fn v2_path(&self) -> Option<&Path> {
        match &self.placement {
            CgroupPlacement::V2 { path } if self.family.is_some() => Some(path),
            _ => None,
        }
    }

    /// Whether process `pid` is in this cgroup (on v2; on v1, in its memory cgroup).
    pub fn holds(&self, pid: i32) -> bool {
        let procs = match &self.placement {
            CgroupPlacement::V1 { memory, .. } => memory.join("cgroup.procs"),
            CgroupPlacement::V2 { path } => path.join("cgroup.procs"),
        };
        let pid = pid.to_string();
        fs::read_to_string(procs).is_ok_and(|t| t.lines().any(|l| l.trim() == pid))
    }

    fn dirs(&self) -> Vec<PathBuf> {
        match &self.placement {
            CgroupPlacement::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let mut v = vec![memory.clone(), pids.clone()];
                v.extend(cpu.iter().cloned());
                v.extend(cpuacct.iter().cloned());
                v.dedup();
                v
            }
            CgroupPlacement::V2 { path } => vec![path.clone()],
        }
    }

    /// A handle that watches this cgroup from outside while it lives.
    pub fn watch(&self) -> CgroupWatch {
        CgroupWatch {
            placement: self.placement.clone(),
        }
    }

    /// The `cgroup.procs` file of each of its directories: writing `0` to each moves the
    /// writer into the cgroup (a process about to exec, say).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Moves a process into the run's cgroup (in every hierarchy).
    pub fn add(&self, pid: i32) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            write(&dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// Whether every thread of the run sleeps (waits on something), for telling when a
    /// program with tool calls in flight is blocked on them.
    pub fn all_sleeping(&self) -> bool {
        let tasks = match &self.placement {
            CgroupPlacement::V1 { pids, .. } => fs::read_to_string(pids.join("tasks")),
            CgroupPlacement::V2 { path } => fs::read_to_string(path.join("cgroup.threads")),
        };
        let Ok(tasks) = tasks else { return false };
        tasks.lines().all(|tid| {
            let Ok(stat) = fs::read_to_string(format!("/proc/{}/stat", tid.trim())) else {
                return true;
            };
            // The state follows the command name, which is in parentheses.
            matches!(
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next()),
                Some('S' | 'T' | 't' | 'Z' | 'X' | 'I')
            )
        })
    }

    /// The thread ids of every process in the run's cgroup, as the host names them.
    pub fn threads(&self) -> Vec<i32> {
        let tasks = match &self.placement {
            CgroupPlacement::V1 { pids, .. } => fs::read_to_string(pids.join("tasks")),
            CgroupPlacement::V2 { path } => fs::read_to_string(path.join("cgroup.threads")),
        };
        tasks
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    pub fn cpu_time_ms(&self) -> u64 {
        match &self.placement {
            CgroupPlacement::V1 { cpuacct, .. } => cpuacct
                .as_ref()
                .and_then(|d| read_u64(&d.join("cpuacct.usage")))
                .map_or(0, |ns| ns / 1_000_000),
            CgroupPlacement::V2 { path } => read_keyed(&path.join("cpu.stat"), "usage_usec").map_or(0, |us| us / 1000),
        }
    }

    pub fn usage(&self) -> Usage {
        let watch = self.watch();
        let memory_peak_bytes = match &self.placement {
            CgroupPlacement::V1 { memory, .. } => read_u64(&memory.join("memory.max_usage_in_bytes")),
            CgroupPlacement::V2 { path } => read_u64(&path.join("memory.peak")),
        };
        let (limit_hits, oom_kills) = watch.memory_events();
        Usage {
            cpu_time_ms: self.cpu_time_ms(),
            memory_peak_bytes: memory_peak_bytes.unwrap_or(0),
            oom_killed: oom_kills > 0,
            memory_limit_hit: limit_hits > 0 || oom_kills > 0,
        }
    }

    /// Kills whatever is left and removes the cgroup directories; the last of a
    /// template and its runs to go removes the directory they share.
    pub fn destroy(self) -> Result<(), CgroupError> {
        let mut first_err = None;
        for dir in self.dirs() {
            kill_all(&dir);
            if let Err(e) = remove_when_empty(&dir, Duration::from_secs(5)) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(family) = &self.family {
            // Refused (EBUSY) while the template or another of its runs is still there.
            let _ = fs::remove_dir(family);
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_mounts() {
        let text = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                    35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                    40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                    42 31 0:39 / /sys/fs/cgroup/cpu\\040acct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    22 27 0:21 / /proc rw,relatime - proc proc rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].controllers, vec!["cpu"]);
        assert_eq!(m[1].path, PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(m[2].controllers.is_empty());
        assert!(m[3].v2);
        assert_eq!(m[4].path, PathBuf::from("/sys/fs/cgroup/cpu acct"));
        assert_eq!(m[4].controllers, vec!["cpu", "cpuacct"]);
    }

    /// A template's directory on v2 holds the template's cgroup and its runs': the
    /// sweep of a server's leftovers kills what runs in them and removes all three
    /// levels, and the leak count sees every level. On a real cgroup v2 hierarchy (this
    /// machine's controller-less one, or the v2 machine's).
    #[test]
    fn a_sweep_kills_and_removes_a_templates_directory_with_its_runs() {
        assert!(nix::unistd::geteuid().is_root(), "needs root, to make cgroups");
        let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = parse_mountinfo(&text).into_iter().find(|m| m.v2);
        let mount = mount.expect("needs a cgroup2 mount (this machine and CI have one)");
        let base = mount.path.join(format!("sandcall-sweep-test-{}", std::process::id()));
        let root = CgroupRoot::v2_at(base.clone());
        let template = root.template_placement("tpl");
        let run = root.forked_placement("tpl", "run");
        let (CgroupPlacement::V2 { path: template }, CgroupPlacement::V2 { path: run }) = (template, run) else {
            panic!("v2 placements expected");
        };
        assert_eq!(
            (template.parent(), run.parent()),
            (Some(&*base.join("tpl")), Some(&*base.join("tpl")))
        );
        for dir in [&template, &run, &base.join("plain")] {
            fs::create_dir_all(dir).unwrap();
        }
        let mut sleeper = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        fs::write(run.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
        assert_eq!(root.count_runs(), 4, "tpl, tpl/template, tpl/run, plain");

        assert_eq!(root.sweep(), 4);
        let status = sleeper.wait().unwrap();
        assert_eq!(root.count_runs(), 0);
        fs::remove_dir(&base).unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "the run's process: {status:?}"
        );
    }

    #[test]
    fn reads_keyed_values() {
        let dir = std::env::temp_dir().join(format!("sandcall-cg-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(read_keyed(&dir.join("memory.oom_control"), "oom_kill"), Some(2));
        assert_eq!(read_keyed(&dir.join("memory.oom_control"), "missing"), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
