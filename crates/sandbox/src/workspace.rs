//! Files into and out of the working directory, done by the helper on the host side.
//!
//! Staging happens before the program starts, into a fresh tmpfs. Collection happens
//! after every process of the run is gone, and still trusts nothing the program left:
//! each directory is opened relative to its parent with O_NOFOLLOW, each file is
//! opened with O_NOFOLLOW and checked to be the regular file the walk saw, so no
//! symlink, however placed, makes the helper read or write outside the workspace.

use crate::protocol::{Collect, CollectedFile, InputFile, SkippedFile};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{chown, OpenOptionsExt, PermissionsExt};
use std::path::{Path, StripPrefixError};

/// Directories deeper than this are not walked (each level holds a descriptor and a
/// stack frame of the helper); they are skipped as `too_deep`.
const MAX_DEPTH: usize = 64;

/// Skipped entries listed in full; the total counts all of them.
const MAX_LISTED_SKIPS: usize = 100;

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why staging or collection failed; the run fails with this message.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// An input name that would leave the working directory (the server checks too).
    #[error("bad input name {0:?}")]
    BadInputName(String),
    /// An input's folder that is not below the working directory.
    #[error("{0}")]
    OutsideWorkspace(#[source] StripPrefixError),
    /// Creating, reading, writing or chowning the input `name` (or one of its folders).
    #[error("stage {name}: {source}")]
    Stage {
        name: String,
        #[source]
        source: io::Error,
    },
    /// Opening the working directory to collect from it.
    #[error("open workspace: {0}")]
    OpenWorkspace(#[source] nix::Error),
}

/// One staged input, as collection needs it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Staged {
    pub name: String,
    /// SHA-256 of the content as staged.
    pub sha256: String,
    pub read_only: bool,
    /// The server's label, echoed back.
    pub tag: String,
}

/// The inputs that are reported as they were whatever the run did: the read-only ones.
pub(crate) fn read_only_tags(staged: &[Staged]) -> Vec<String> {
    staged.iter().filter(|s| s.read_only).map(|s| s.tag.clone()).collect()
}

/// Runs `f` with the filesystem ids `uid`/`gid` when `switch` (and the helper is root).
/// A forked run's tmpfs mounts belong to its own user namespace, where the kernel
/// refuses to create a file for an owner it does not map (EOVERFLOW); the helper's root
/// is not mapped there, the sandbox user's host ids are. Only the filesystem ids change,
/// for this one thread (the helper has one), and they are restored before returning.
pub(crate) fn as_ids<T>(switch: bool, uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    if !switch || !nix::unistd::geteuid().is_root() {
        return f();
    }
    let old_gid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
    let old_uid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
    let out = f();
    nix::unistd::setfsuid(old_uid);
    nix::unistd::setfsgid(old_gid);
    out
}

/// Copies the inputs into the (still empty) workspace, owned by the sandbox user.
/// Returns each staged input with the SHA-256 of its content, in order. With
/// `create_as_owner` (a forked run), folders and files are created under the sandbox
/// user's ids (`as_ids`); the inputs are still read as the helper.
pub(crate) fn stage(
    work: &Path,
    inputs: &[InputFile],
    uid: u32,
    gid: u32,
    create_as_owner: bool,
) -> Result<Vec<Staged>, WorkspaceError> {
    let mut staged = Vec::with_capacity(inputs.len());
    for input in inputs {
        let failed = |source| WorkspaceError::Stage {
            name: input.name.clone(),
            source,
        };
        let dest = work.join(&input.name);
        // The server checked the name; check again that it stays below `work`.
        if input.name.split('/').any(|p| p.is_empty() || p == "." || p == "..") || input.name.starts_with('/') {
            return Err(WorkspaceError::BadInputName(input.name.clone()));
        }
        if let Some(parent) = dest.parent() {
            let mut dir = work.to_path_buf();
            for part in parent
                .strip_prefix(work)
                .map_err(WorkspaceError::OutsideWorkspace)?
                .components()
            {
                dir.push(part);
                if !dir.exists() {
                    as_ids(create_as_owner, uid, gid, || fs::create_dir(&dir)).map_err(failed)?;
                    chown(&dir, Some(uid), Some(gid)).map_err(failed)?;
                }
            }
        }
        let mut src = File::open(&input.source).map_err(failed)?;
        let mut out = as_ids(create_as_owner, uid, gid, || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&dest)
        })
        .map_err(failed)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = src.read(&mut buf).map_err(failed)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(failed)?;
        }
        chown(&dest, Some(uid), Some(gid)).map_err(failed)?;
        staged.push(Staged {
            name: input.name.clone(),
            sha256: hex(&hasher.finalize()),
            read_only: input.read_only,
            tag: input.tag.clone(),
        });
    }
    Ok(staged)
}

/// Whether the working directory holds nothing (no input was staged, and the run left
/// no entry). Reads the directory only.
pub(crate) fn is_empty(work: &Path) -> bool {
    fs::read_dir(work).map(|mut d| d.next().is_none()).unwrap_or(false)
}

/// What collection found.
#[derive(Default)]
pub(crate) struct Collected {
    pub files: Vec<CollectedFile>,
    pub skipped: Vec<SkippedFile>,
    pub skipped_total: usize,
    /// Tags of the inputs to report as they were (see `RunResult.inherited`).
    pub inherited: Vec<String>,
}

impl Collected {
    fn skip(&mut self, name: &str, reason: &str) {
        self.skipped_total += 1;
        if self.skipped.len() < MAX_LISTED_SKIPS {
            self.skipped.push(SkippedFile {
                name: name.to_owned(),
                reason: reason.to_owned(),
            });
        }
    }
}

struct Walk<'a> {
    opts: &'a Collect,
    inputs: HashMap<&'a str, &'a Staged>,
    /// Names of the inputs found as they were staged.
    unchanged: HashSet<String>,
    seen_inodes: HashSet<(u64, u64)>,
    out: Collected,
    next: usize,
    /// Apparent bytes of the files collected so far, against `opts.max_total_bytes`.
    total: u64,
}

/// Collects every regular file the run created or changed into `opts.outbox`, except
/// read-only inputs; lists the inputs to report as they were.
pub(crate) fn collect(work: &Path, opts: &Collect, staged: &[Staged]) -> Result<Collected, WorkspaceError> {
    let root = openat(
        None,
        work,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(WorkspaceError::OpenWorkspace)?;
    // SAFETY: openat returned a fresh descriptor.
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    let mut walk = Walk {
        opts,
        inputs: staged.iter().map(|s| (s.name.as_str(), s)).collect(),
        unchanged: HashSet::new(),
        seen_inodes: HashSet::new(),
        out: Collected::default(),
        next: 0,
        total: 0,
    };
    walk.dir(root, "", 0);
    let mut out = walk.out;
    out.inherited = staged
        .iter()
        .filter(|s| s.read_only || walk.unchanged.contains(&s.name))
        .map(|s| s.tag.clone())
        .collect();
    Ok(out)
}

/// A name fit for the API: valid UTF-8 without control characters.
fn clean_name(raw: &[u8]) -> Option<&str> {
    std::str::from_utf8(raw)
        .ok()
        .filter(|s| !s.chars().any(char::is_control))
}

impl Walk<'_> {
    fn dir(&mut self, dirfd: OwnedFd, prefix: &str, depth: usize) {
        let Ok(mut dir) = nix::dir::Dir::from_fd(dirfd.as_raw_fd()) else {
            return;
        };
        // Dir now owns the descriptor.
        std::mem::forget(dirfd);
        let mut names: Vec<Vec<u8>> = dir
            .iter()
            .flatten()
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        names.sort();
        let fd = dir.as_raw_fd();
        for raw in names {
            let shown = format!("{prefix}{}", String::from_utf8_lossy(&raw));
            let Some(name) = clean_name(&raw) else {
                self.out.skip(&shown, "invalid_name");
                continue;
            };
            let rel = format!("{prefix}{name}");
            let Ok(st) = fstatat(Some(fd), raw.as_slice(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) else {
                self.out.skip(&rel, "not_regular_file");
                continue;
            };
            match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFLNK => self.out.skip(&rel, "symlink"),
                SFlag::S_IFDIR if depth + 1 >= MAX_DEPTH => self.out.skip(&rel, "too_deep"),
                SFlag::S_IFDIR => {
                    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                    match openat(Some(fd), raw.as_slice(), flags, Mode::empty()) {
                        // SAFETY: openat returned a fresh descriptor.
                        Ok(child) => self.dir(unsafe { OwnedFd::from_raw_fd(child) }, &format!("{rel}/"), depth + 1),
                        Err(_) => self.out.skip(&rel, "symlink"),
                    }
                }
                SFlag::S_IFREG => self.file(fd, &raw, &rel, st.st_size as u64),
                _ => self.out.skip(&rel, "not_regular_file"),
            }
        }
    }

    /// Whether a file of `size` bytes would take the collected total over its bound.
    fn over_total(&self, size: u64) -> bool {
        self.total.saturating_add(size) > self.opts.max_total_bytes
    }

    fn file(&mut self, dirfd: RawFd, raw: &[u8], rel: &str, size: u64) {
        let input = self.inputs.get(rel).copied();
        // A read-only input is the caller's infrastructure: never an output, whatever
        // the run did to it, and not listed as skipped either.
        if input.is_some_and(|i| i.read_only) {
            return;
        }
        if size > self.opts.max_file_bytes {
            return self.out.skip(rel, "too_large");
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        let Ok(fd) = openat(Some(dirfd), raw, flags, Mode::empty()) else {
            return self.out.skip(rel, "not_regular_file");
        };
        // SAFETY: openat returned a fresh descriptor.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let Ok(st) = fstat(file.as_raw_fd()) else {
            return self.out.skip(rel, "not_regular_file");
        };
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
            return self.out.skip(rel, "not_regular_file");
        }
        if st.st_size as u64 > self.opts.max_file_bytes {
            return self.out.skip(rel, "too_large");
        }
        let inode = (st.st_dev, st.st_ino);
        if st.st_nlink > 1 && self.seen_inodes.contains(&inode) {
            return self.out.skip(rel, "hard_link");
        }
        if self.out.files.len() >= self.opts.max_files {
            return self.out.skip(rel, "too_many_files");
        }
        // The copy writes a sparse file's holes as real bytes, so the total is counted in
        // apparent size, before anything is read. An input may still turn out unchanged
        // (and cost nothing), so it is copied and judged after.
        if input.is_none() && self.over_total(st.st_size as u64) {
            return self.out.skip(rel, "over_workspace_limit");
        }
        // The outbox is made for the first file: most runs have none.
        if self.next == 0 && !self.opts.outbox.exists() {
            let made = fs::create_dir(&self.opts.outbox)
                .and_then(|()| fs::set_permissions(&self.opts.outbox, fs::Permissions::from_mode(0o700)));
            if made.is_err() {
                return self.out.skip(rel, "storage_full");
            }
        }
        let dest = self.opts.outbox.join(self.next.to_string());
        match copy_hashed(&mut file, &dest, self.opts.max_file_bytes) {
            Ok((size, sha256)) => {
                if input.is_some_and(|i| i.sha256 == sha256) {
                    // An input the run did not change is not a new output: it is
                    // reported as inherited.
                    let _ = fs::remove_file(&dest);
                    self.unchanged.insert(rel.to_owned());
                    return;
                }
                if self.over_total(size) {
                    let _ = fs::remove_file(&dest);
                    return self.out.skip(rel, "over_workspace_limit");
                }
                self.total += size;
                self.next += 1;
                self.seen_inodes.insert(inode);
                self.out.files.push(CollectedFile {
                    name: rel.to_owned(),
                    size,
                    sha256,
                    path: dest,
                    input: input.map(|i| i.tag.clone()),
                });
            }
            Err(e) => {
                let _ = fs::remove_file(&dest);
                let reason = if e.raw_os_error() == Some(libc::ENOSPC) {
                    "storage_full"
                } else {
                    "unreadable"
                };
                self.out.skip(rel, reason);
            }
        }
    }
}

fn copy_hashed(src: &mut File, dest: &Path, cap: u64) -> io::Result<(u64, String)> {
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > cap {
            return Err(io::Error::other("grew past the cap"));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    Ok((total, hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collected_bytes_are_bounded_by_apparent_size() {
        let dir = std::env::temp_dir().join(format!("sandcall-collect-test-{}", std::process::id()));
        let work = dir.join("work");
        fs::create_dir_all(&work).unwrap();
        // Five sparse files of 1 MiB (no blocks), and an input left as it was staged.
        for i in 0..5 {
            File::create(work.join(format!("s{i}")))
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
        }
        fs::write(work.join("t_input"), b"unchanged").unwrap();
        let inputs = [Staged {
            name: "t_input".into(),
            sha256: hex(&Sha256::digest(b"unchanged")),
            read_only: false,
            tag: "T".into(),
        }];
        let opts = Collect {
            outbox: dir.join("outbox"),
            max_files: 100,
            max_file_bytes: 4 << 20,
            max_total_bytes: 3 << 20,
        };
        let found = collect(&work, &opts, &inputs).unwrap();
        let names: Vec<&str> = found.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["s0", "s1", "s2"]);
        let skipped: Vec<(&str, &str)> = found
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason.as_str()))
            .collect();
        // The unchanged input is neither collected nor listed, though the total is full.
        assert_eq!(
            skipped,
            [("s3", "over_workspace_limit"), ("s4", "over_workspace_limit")]
        );
        let copied: u64 = fs::read_dir(&opts.outbox)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(copied, 3 << 20, "nothing past the bound is left in the outbox");
        assert_eq!(found.inherited, ["T"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inputs_come_back_inherited_changed_or_never_when_read_only() {
        let dir = std::env::temp_dir().join(format!("sandcall-inherit-test-{}", std::process::id()));
        let work = dir.join("work");
        fs::create_dir_all(work.join("skill/scripts")).unwrap();
        let staged = |name: &str, content: &[u8], read_only: bool| Staged {
            name: name.into(),
            sha256: hex(&Sha256::digest(content)),
            read_only,
            tag: format!("tag:{name}"),
        };
        let inputs = [
            staged("same.txt", b"same", false),
            staged("changed.txt", b"before", false),
            staged("skill/scripts/run.py", b"print(1)", true),
            staged("gone.txt", b"gone", false),
            staged("ro_gone.txt", b"x", true),
        ];
        fs::write(work.join("same.txt"), b"same").unwrap();
        fs::write(work.join("changed.txt"), b"after").unwrap();
        // A read-only input the run rewrote is still not an output.
        fs::write(work.join("skill/scripts/run.py"), b"print(2)").unwrap();
        fs::write(work.join("new.txt"), b"new").unwrap();
        let opts = Collect {
            outbox: dir.join("outbox"),
            max_files: 100,
            max_file_bytes: 1 << 20,
            max_total_bytes: 1 << 20,
        };
        let found = collect(&work, &opts, &inputs).unwrap();
        let got: Vec<(&str, Option<&str>)> = found
            .files
            .iter()
            .map(|f| (f.name.as_str(), f.input.as_deref()))
            .collect();
        assert_eq!(got, [("changed.txt", Some("tag:changed.txt")), ("new.txt", None)]);
        assert!(found.skipped.is_empty(), "{:?}", found.skipped);
        assert_eq!(
            found.inherited,
            ["tag:same.txt", "tag:skill/scripts/run.py", "tag:ro_gone.txt"]
        );
        assert_eq!(read_only_tags(&inputs), ["tag:skill/scripts/run.py", "tag:ro_gone.txt"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
