//! Small pieces of plumbing for the helper's single-threaded poll loop.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

pub(crate) fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
        }
    }
}

pub(crate) fn write_all(fd: &OwnedFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
        }
    }
    Ok(())
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    Ok(())
}

pub(crate) fn timeout_of(d: Option<Duration>) -> PollTimeout {
    match d {
        None => PollTimeout::NONE,
        // Round up so that a wait never ends a fraction of a millisecond early.
        Some(d) => {
            PollTimeout::try_from(d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// Waits until `fd` is readable or `wait` passes. Returns whether it is readable.
pub(crate) fn wait_readable(fd: &OwnedFd, wait: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, timeout_of(Some(wait))) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
        }
    }
}

/// Newline-delimited messages from a pipe, readable both blocking and from a poll loop.
pub(crate) struct Lines {
    pub(crate) fd: OwnedFd,
    buf: Vec<u8>,
    /// No newline in `buf[..scanned]`: each byte is looked at once, however many reads a
    /// long line takes.
    scanned: usize,
    /// The longest line accepted; whoever sends more without a newline is cut off.
    max_line: usize,
    pub(crate) eof: bool,
}

/// The longest line from the server: a run message carries the code and stdin.
pub(crate) const MAX_CONTROL_LINE: usize = 64 << 20;
/// The longest line on a channel whose messages are a few words (init's reports, a
/// launched program's `exit N` on fd 3).
pub(crate) const MAX_SHORT_LINE: usize = 64 << 10;

impl Lines {
    pub(crate) fn new(fd: OwnedFd, max_line: usize) -> Self {
        Lines {
            fd,
            buf: Vec::new(),
            scanned: 0,
            max_line,
            eof: false,
        }
    }

    /// Reads once (the fd is readable or blocking). Returns false at end of file.
    pub(crate) fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 64 * 1024];
        // Never more than one byte past the cap, so a flood is noticed before it is held.
        let room = (self.max_line + 1).saturating_sub(self.buf.len()).clamp(1, chunk.len());
        match read_some(&self.fd, &mut chunk[..room]) {
            Ok(0) => {
                self.eof = true;
                Ok(false)
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                // The callers take every complete line after each read, so what is buffered
                // here is one unfinished line.
                if self.buf.len() > self.max_line {
                    self.buf = Vec::new();
                    self.scanned = 0;
                    self.eof = true;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "message too long"));
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The next complete line, if one is buffered.
    pub(crate) fn take_line(&mut self) -> Option<Vec<u8>> {
        let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') else {
            self.scanned = self.buf.len();
            return None;
        };
        let pos = self.scanned + pos;
        let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
        line.pop();
        self.scanned = 0;
        // A large message leaves a large allocation behind: give it back.
        if self.buf.capacity() > (1 << 20) && self.buf.len() < self.buf.capacity() / 4 {
            self.buf.shrink_to_fit();
        }
        Some(line)
    }

    /// Blocks until a full line arrives; None at end of file.
    pub(crate) fn read_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(line) = self.take_line() {
                return Ok(Some(line));
            }
            if self.eof || !self.fill()? {
                return Ok(None);
            }
        }
    }
}

/// Output kept up to a cap; what is over the cap is read and dropped so that the
/// program never blocks on a full pipe.
#[derive(Default)]
pub(crate) struct Capture {
    pub(crate) bytes: Vec<u8>,
    pub(crate) truncated: bool,
}

impl Capture {
    pub(crate) fn push(&mut self, data: &[u8], cap: usize) {
        let room = cap.saturating_sub(self.bytes.len());
        if data.len() > room {
            self.truncated = true;
        }
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// One message from the unix socket `from` into `buf`, and the descriptors sent with it
/// (SCM_RIGHTS), close-on-exec and owned: its length, the descriptors (room for `N`), and
/// whether the kernel dropped some because more than `N` came.
pub(crate) fn receive_fds<const N: usize>(
    from: std::os::fd::RawFd,
    buf: &mut [u8],
    flags: nix::sys::socket::MsgFlags,
) -> nix::Result<(usize, Vec<std::os::fd::OwnedFd>, bool)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};
    let mut space = nix::cmsg_space!([RawFd; N]);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(from, &mut iov, Some(&mut space), flags | MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: the kernel installed these descriptors for this process just now.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok((msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_truncates_at_the_cap() {
        let mut c = Capture::default();
        c.push(b"hello ", 8);
        assert!(!c.truncated);
        c.push(b"world", 8);
        assert!(c.truncated);
        assert_eq!(c.text(), "hello wo");
    }

    #[test]
    fn capture_replaces_invalid_utf8() {
        let mut c = Capture::default();
        c.push(b"a\xffb", 100);
        assert_eq!(c.text(), "a\u{fffd}b");
    }

    #[test]
    fn lines_split_messages() {
        let (r, w) = nix::unistd::pipe().unwrap();
        write_all(&w, b"one\ntwo\nthr").unwrap();
        drop(w);
        let mut lines = Lines::new(r, MAX_SHORT_LINE);
        assert_eq!(lines.read_line().unwrap(), Some(b"one".to_vec()));
        assert_eq!(lines.read_line().unwrap(), Some(b"two".to_vec()));
        assert_eq!(lines.read_line().unwrap(), None);
    }

    #[test]
    fn a_line_over_the_cap_cuts_the_channel_off() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let mut lines = Lines::new(r, 1000);
        write_all(&w, &[b'x'; 1000]).unwrap();
        assert!(lines.fill().is_ok());
        assert_eq!(lines.take_line(), None);
        // One byte over the cap is read (never more), and ends the channel.
        write_all(&w, &[b'x'; 2000]).unwrap();
        assert!(lines.fill().is_err());
        assert!(lines.eof);
    }
}
