//! Builds the sandbox's filesystem inside its own mount namespace and pivots into it.
//!
//! Runs in the sandbox's init process (pid 1 of the new pid namespace), which holds every
//! capability of the new user namespace and nothing outside it. The new root is a small
//! tmpfs that ends up read-only; the runtime is the host's `/usr` bound read-only.

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};
use nix::unistd::{chdir, pivot_root};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// Host files a runtime needs from /etc, bound read-only when present.
const ETC_FILES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "protocols",
    "services",
];

/// Top-level host paths of the runtime: real directories are bound read-only, symlinks
/// (merged /usr) are recreated as the same symlinks.
pub(crate) const RUNTIME_TOP: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Device nodes bound from the host; the sandbox cannot create device nodes itself.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The sandbox's scratch space, a tmpfs of its own each.
const TMP: &str = "/tmp";
const SHM: &str = "/dev/shm";
/// The run's working directory (the staged workspace) and its code.
const WORKDIR: &str = "/mnt/data";
const CODE: &str = "/run/sandcall";
const PROC: &str = "/proc";
/// The npm packages for programs.
const NODE_MODULES: &str = "/node_modules";

/// Where `build_root` mounts something of the sandbox's own after it has bound the
/// runtime's host paths (`extra_runtime_paths`), each with what it puts there: a host
/// path under one of these is hidden from every run, so `sandcall serve` refuses such a
/// runtime at start (`sandcall_engine::visible::check_visible`).
pub const MOUNTED_OVER: [(&str, &str); 6] = [
    (TMP, "a tmpfs of its own"),
    (SHM, "a tmpfs of its own"),
    (PROC, "its own /proc"),
    (WORKDIR, "the run's working directory"),
    (CODE, "the run's code"),
    (NODE_MODULES, "the npm packages for programs"),
];

/// What of the host `build_root` binds into a program's root: the runtime's top-level
/// directories, `extra_runtime_paths`, `node_modules` and the /etc files, each an absolute
/// host path that exists, in `paths`; and the top-level symlinks it recreates (merged
/// `/usr`), each with its target, in `symlinks`. `build_root` binds these `paths` (all
/// but `node_modules`, which it binds at `/node_modules`), so a sandbox built inside
/// another one (the `gvisor` tier's) that is given exactly these of the host lacks
/// nothing.
#[derive(Debug, Default, PartialEq)]
pub struct HostView {
    pub paths: Vec<PathBuf>,
    pub symlinks: Vec<(PathBuf, PathBuf)>,
}

pub fn host_view(extra_runtime_paths: &[PathBuf], node_modules: Option<&Path>) -> HostView {
    let mut view = HostView::default();
    for name in RUNTIME_TOP {
        let host = Path::new("/").join(name);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = fs::read_link(&host) {
                view.symlinks.push((host, target));
            }
        } else if meta.is_dir() {
            view.paths.push(host);
        }
    }
    view.paths
        .extend(extra_runtime_paths.iter().filter(|p| p.exists()).cloned());
    view.paths.extend(node_modules.map(Path::to_path_buf));
    for name in ETC_FILES {
        let host = Path::new("/etc").join(name);
        if host_file(&host) {
            view.paths.push(host);
        }
    }
    view
}

/// `path` (absolute) below the new root.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct MountError {
    step: String,
    source: std::io::Error,
}

fn step<T, E: Into<std::io::Error>>(what: impl FnOnce() -> String, r: Result<T, E>) -> Result<T, MountError> {
    r.map_err(|e| MountError {
        step: what(),
        source: e.into(),
    })
}

fn errno(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// What the init process needs to build the root.
pub struct RootSpec<'a> {
    /// An empty directory on which the new root is assembled before pivot_root.
    pub new_root: &'a Path,
    /// The directories the helper staged: the working directory and the code.
    pub workspace: &'a Path,
    pub code: &'a Path,
    pub extra_runtime_paths: &'a [PathBuf],
    /// Bound read-only at `/node_modules` (see `Prepare::node_modules`).
    pub node_modules: Option<&'a Path>,
    pub tmp_bytes: u64,
    /// The helper's own executable, bound as the tool-call client at
    /// `/run/sandcall/bin/sandcall` onto the mount point the helper made. A path, not
    /// /proc/self/exe: that names a mount of the host's namespace, which cannot be bound
    /// from this one.
    pub tool_client: Option<&'a Path>,
}

fn tmpfs(target: &Path, options: &str) -> Result<(), MountError> {
    step(
        || format!("mount tmpfs on {}", target.display()),
        mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options),
        )
        .map_err(errno),
    )
}

/// Makes every mount of this mount namespace private: nothing mounted afterwards
/// propagates to (or from) the namespace it was copied from.
pub(crate) fn make_root_private() -> nix::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
}

/// `make_root_private` in a sandbox's init. gVisor's kernel gives a mount namespace
/// made by the same `clone` as a user namespace to the parent's user namespace, where
/// the init has no capability; a mount namespace unshared from inside the new user
/// namespace is the init's own. Linux never needs the second try.
fn make_own_root_private() -> nix::Result<()> {
    match make_root_private() {
        Err(nix::errno::Errno::EPERM) => {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            make_root_private()
        }
        other => other,
    }
}

/// Read-only bind of a host path.
fn bind_ro(source: &Path, target: &Path) -> Result<(), MountError> {
    bind_rw(source, target)?;
    remount_ro(target)
}

/// Makes the mount at `target` read-only, nosuid and nodev (`read_only_remount`).
fn remount_ro(target: &Path) -> Result<(), MountError> {
    let existing = step(
        || format!("statvfs {}", target.display()),
        statvfs(target).map_err(errno),
    )?
    .flags();
    step(
        || format!("remount {} read-only", target.display()),
        mount(
            None::<&str>,
            target,
            None::<&str>,
            read_only_remount(existing),
            None::<&str>,
        )
        .map_err(errno),
    )
}

/// The flags that remount a bind whose mount has `existing` read-only, nosuid and nodev.
/// The remount must repeat the flags the kernel locked on it (noexec, atime) or it is
/// refused in a user namespace.
pub fn read_only_remount(existing: FsFlags) -> MsFlags {
    let mut flags =
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for (st, ms) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if existing.contains(st) {
            flags |= ms;
        }
    }
    flags
}

fn bind_rw(source: &Path, target: &Path) -> Result<(), MountError> {
    step(
        || format!("bind {} on {}", source.display(), target.display()),
        mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(errno),
    )
}

fn mkdir(path: &Path, mode: u32) -> Result<(), MountError> {
    step(|| format!("mkdir {}", path.display()), fs::create_dir_all(path))?;
    step(
        || format!("chmod {}", path.display()),
        fs::set_permissions(path, fs::Permissions::from_mode(mode)),
    )
}

fn touch(path: &Path) -> Result<(), MountError> {
    step(|| format!("create {}", path.display()), fs::write(path, b""))
}

/// What the sandbox's /etc/passwd and friends say: the sandbox user and no host account.
const ETC_WRITTEN: [(&str, &str); 4] = [
    ("passwd", "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
    ("group", "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"),
    ("hostname", "sandcall\n"),
    ("hosts", "127.0.0.1 localhost sandcall\n::1 localhost\n"),
];

/// The mount points of the new root, created by the helper (host side, before clone).
///
/// The skeleton is made on the host side because inside the new user namespace init
/// keeps the helper's host uid until the root is built, and files cannot be created
/// with a uid the namespace does not map; init only mounts onto what exists here.
pub fn prepare_skeleton(root: &Path, extra_runtime_paths: &[PathBuf], node_modules: bool) -> Result<(), MountError> {
    for name in RUNTIME_TOP {
        let host = Path::new("/").join(name);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        let target = root.join(name);
        if meta.file_type().is_symlink() {
            let link = step(|| format!("readlink {}", host.display()), fs::read_link(&host))?;
            step(|| format!("symlink {}", target.display()), symlink(link, &target))?;
        } else if meta.is_dir() {
            mkdir(&target, 0o755)?;
        }
    }
    for extra in extra_runtime_paths {
        let target = root.join(extra.strip_prefix("/").unwrap_or(extra));
        if extra.is_dir() {
            mkdir(&target, 0o755)?;
        } else if extra.exists() {
            if let Some(parent) = target.parent() {
                mkdir(parent, 0o755)?;
            }
            touch(&target)?;
        }
    }
    let etc = root.join("etc");
    mkdir(&etc, 0o755)?;
    for name in ETC_FILES {
        if host_file(&Path::new("/etc").join(name)) {
            touch(&etc.join(name))?;
        }
    }
    for (name, text) in ETC_WRITTEN {
        step(|| format!("write /etc/{name}"), fs::write(etc.join(name), text))?;
    }
    let dev = root.join("dev");
    mkdir(&dev, 0o755)?;
    for name in DEVICES {
        if Path::new("/dev").join(name).exists() {
            touch(&dev.join(name))?;
        }
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        step(|| format!("symlink /dev/{link}"), symlink(target, dev.join(link)))?;
    }
    for (dir, mode) in [
        (SHM, 0o1777),
        (TMP, 0o1777),
        (WORKDIR, 0o755),
        (CODE, 0o755),
        (PROC, 0o555),
    ] {
        mkdir(&under(root, dir), mode)?;
    }
    if node_modules {
        mkdir(&under(root, NODE_MODULES), 0o755)?;
    }
    Ok(())
}

fn host_file(path: &Path) -> bool {
    fs::metadata(path).map(|m| m.is_file()).unwrap_or(false)
}

/// Mounts the new root onto the skeleton and pivots into it (in init). On return the
/// process's root is the new tree, the host's tree is detached and the working
/// directory is `/mnt/data`.
pub fn build_root(spec: &RootSpec) -> Result<(), MountError> {
    let root = spec.new_root;
    // Nothing done below may propagate back to the host's mount namespace.
    step(|| "make / private".into(), make_own_root_private().map_err(errno))?;
    // pivot_root needs the new root to be a mount point of its own.
    bind_rw(root, root)?;

    // The runtime (the host's /usr, any real /lib64, ..., the extra runtime paths) and
    // the few /etc files the loader and libc read, read-only at their own paths; passwd
    // and group are our own.
    for host in host_view(spec.extra_runtime_paths, None).paths {
        bind_ro(&host, &root.join(host.strip_prefix("/").unwrap_or(&host)))?;
    }
    // The npm packages for programs, at the root: Node looks for `node_modules` in every
    // directory above the importing file, and `/` is above both the code and /mnt/data.
    if let Some(modules) = spec.node_modules {
        bind_ro(modules, &under(root, NODE_MODULES))?;
    }
    // /dev: the harmless device nodes, bound from the host.
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            bind_device(&host, &root.join("dev").join(name))?;
        }
    }
    // Private scratch space, and the working directory and code the helper staged.
    tmpfs(&under(root, SHM), &format!("size={},mode=1777", spec.tmp_bytes))?;
    tmpfs(&under(root, TMP), &format!("size={},mode=1777", spec.tmp_bytes))?;
    bind_rw(spec.workspace, &under(root, WORKDIR))?;
    bind_ro(spec.code, &under(root, CODE))?;
    if let Some(exe) = spec.tool_client {
        bind_ro(exe, &under(root, CODE).join("bin/sandcall"))?;
    }

    // Our own /proc: we are pid 1 of the new pid namespace, so it lists only the run.
    step(
        || "mount /proc".into(),
        mount(
            Some("proc"),
            &under(root, PROC),
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(errno),
    )?;

    // The skeleton itself becomes read-only once every mount point in it is used.
    remount_ro(root)?;

    // pivot_root with the old root stacked on the new one, then detach it: afterwards no
    // path leads back to the host's tree.
    step(|| "chdir new root".into(), chdir(root).map_err(errno))?;
    step(|| "pivot_root".into(), pivot_root(".", ".").map_err(errno))?;
    step(
        || "detach old root".into(),
        umount2(".", MntFlags::MNT_DETACH).map_err(errno),
    )?;
    step(|| format!("chdir {WORKDIR}"), chdir(WORKDIR).map_err(errno))?;
    Ok(())
}

/// Device nodes are bound as they are: writable (writing to /dev/null must work) and
/// without nodev. Their inodes belong to the host's root, so the sandbox cannot chmod or
/// replace them, and the tmpfs around them refuses new device nodes.
fn bind_device(source: &Path, target: &Path) -> Result<(), MountError> {
    bind_rw(source, target)
}
