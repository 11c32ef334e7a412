//! A run's way out (`Run::egress`, docs/egress.md): a TCP listener on 127.0.0.1 inside
//! the run's own network namespace, whose connections the helper relays, byte for byte,
//! to a unix socket on the host where the server's egress proxy serves them.
//!
//! The program never reaches the host socket itself: it is not in the sandbox's root,
//! and the sandbox's network namespace has only its loopback. A short-lived child of the
//! helper enters that namespace to bring the loopback up and create the listener (a
//! socket belongs to the namespace it was created in) and hands it back.
//!
//! Everything here is non-blocking and driven by the run's poll loop (`run.rs`): no
//! thread, no tokio. Each connection holds two fixed buffers, and connections are
//! bounded, so a program cannot make the helper hold more than
//! `MAX_RELAYS` × 2 × `RELAY_BUFFER` bytes.

use super::HelperError;
use crate::protocol::Egress;
use nix::poll::PollFlags;
use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{
    accept4, connect, send, sendmsg, shutdown, socket, AddressFamily, ControlMessage, MsgFlags, Shutdown, SockFlag,
    SockType, UnixAddr,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Connections relayed at once; more are closed as soon as they are accepted (the proxy
/// bounds a run's connections itself; this bounds the helper's buffers).
pub(crate) const MAX_RELAYS: usize = 64;
/// Bytes held per direction of a connection.
const RELAY_BUFFER: usize = 64 * 1024;
/// The most the relays' buffers hold together (the helper's memory budget counts it).
pub(crate) const MAX_RELAY_BYTES: u64 = (MAX_RELAYS * 2 * RELAY_BUFFER) as u64;

/// One direction of a relayed connection: bytes read from one end, not yet written to
/// the other.
struct Pipe {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The reading end said end of file (or failed): nothing more comes.
    closed: bool,
    /// The writing end was shut down for writing after the last byte.
    shut: bool,
}

impl Pipe {
    fn new() -> Self {
        Pipe {
            buf: vec![0u8; RELAY_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            closed: false,
            shut: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Reads what `from` holds while there is room.
    fn fill(&mut self, from: &OwnedFd) -> Result<(), ()> {
        if self.closed || self.end == self.buf.len() {
            return Ok(());
        }
        match nix::unistd::read(from.as_raw_fd(), &mut self.buf[self.end..]) {
            Ok(0) => self.closed = true,
            Ok(n) => self.end += n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(_) => return Err(()),
        }
        Ok(())
    }

    /// Writes what it holds to `to`; once the reading end is done and everything is
    /// written, shuts `to` down for writing so that its reader sees the end.
    fn flush(&mut self, to: &OwnedFd) -> Result<(), ()> {
        if !self.is_empty() {
            // MSG_NOSIGNAL: a reader gone away is an error here, not a SIGPIPE.
            match send(to.as_raw_fd(), &self.buf[self.start..self.end], MsgFlags::MSG_NOSIGNAL) {
                Ok(n) => self.start += n,
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(_) => return Err(()),
            }
            // All written: the whole buffer is room again (`poll_fds` reads only
            // while there is room).
            if self.is_empty() {
                self.start = 0;
                self.end = 0;
            }
        }
        if self.closed && self.is_empty() && !self.shut {
            self.shut = true;
            let _ = shutdown(to.as_raw_fd(), Shutdown::Write);
        }
        Ok(())
    }
}

/// A program's connection to the listener and the helper's to the host socket.
struct Relay {
    client: OwnedFd,
    upstream: OwnedFd,
    /// Program → proxy, proxy → program.
    out: Pipe,
    back: Pipe,
}

impl Relay {
    fn done(&self) -> bool {
        self.out.shut && self.back.shut
    }
}

/// The listener inside the run's network namespace and the connections being relayed.
pub(crate) struct EgressRelays {
    listener: OwnedFd,
    upstream: Upstream,
    relays: Vec<Option<Relay>>,
}

/// Where each relayed connection's other end comes from.
enum Upstream {
    /// The proxy's socket on the host, connected to directly (the `namespace` tier).
    Socket(std::path::PathBuf),
    /// The channel the server passed into the gVisor sandbox (`Egress::channel`): asked
    /// once per connection. None once an answer did not come in time: a late one would
    /// be taken for the next question's.
    Channel(Option<OwnedFd>),
}

/// How long the helper waits for the server to answer on the channel (it connects a
/// local socket: milliseconds). The helper's loop waits meanwhile.
const CHANNEL_WAIT_MS: u16 = 5_000;

impl Upstream {
    fn for_endpoint(endpoint: &Egress) -> Result<Self, HelperError> {
        let Some(fd) = endpoint.channel else {
            return Ok(Upstream::Socket(endpoint.socket.clone()));
        };
        // Only the descriptor `runsc --pass-fd` puts in place, never the helper's own.
        if fd != crate::protocol::EGRESS_CHANNEL_FD {
            return Err(HelperError::EgressListen(io::Error::other(format!(
                "egress channel: descriptor {fd} is not {}",
                crate::protocol::EGRESS_CHANNEL_FD
            ))));
        }
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
            .map_err(|e| HelperError::EgressListen(io::Error::other(format!("egress channel: {e}"))))?;
        // SAFETY: the descriptor was passed in for this use alone, and is owned from here on.
        Ok(Upstream::Channel(Some(unsafe {
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        })))
    }

    /// A non-blocking connection to the proxy's socket.
    fn connect(&mut self) -> io::Result<OwnedFd> {
        match self {
            Upstream::Socket(path) => connect_host(path),
            Upstream::Channel(channel) => {
                let Some(fd) = channel.as_ref() else {
                    return Err(io::Error::other("the egress channel is closed"));
                };
                match ask_channel(fd) {
                    // No answer in time, or none ever: the channel is done.
                    Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::UnexpectedEof) => {
                        *channel = None;
                        Err(e)
                    }
                    got => got,
                }
            }
        }
    }
}

impl EgressRelays {
    /// Brings up the loopback of the network namespace `theirs` (the run's) and listens on
    /// 127.0.0.1:`endpoint.port` there. A child does it and hands the listener back: the
    /// helper itself never leaves its own network namespace (without root it could not
    /// return to the host's, which its user namespace does not own).
    pub(crate) fn open(theirs: &std::fs::File, endpoint: &Egress) -> Result<Self, HelperError> {
        let (ours, child_end) = std::os::unix::net::UnixStream::pair().map_err(HelperError::EgressListen)?;
        // SAFETY: the helper is single-threaded, so the child's copy of its memory is
        // consistent; the child makes a few system calls and leaves with _exit.
        match unsafe { nix::unistd::fork() }.map_err(HelperError::EgressFork)? {
            nix::unistd::ForkResult::Child => {
                drop(ours);
                let made = setns(theirs.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)
                    .and_then(|()| listen_inside(endpoint.port));
                let sent = match made {
                    Ok(listener) => {
                        let fds = [listener.as_raw_fd()];
                        let cmsg = [ControlMessage::ScmRights(&fds)];
                        sendmsg::<()>(
                            child_end.as_raw_fd(),
                            &[io::IoSlice::new(b"k")],
                            &cmsg,
                            MsgFlags::empty(),
                            None,
                        )
                    }
                    Err(e) => {
                        let text = format!("e{e}");
                        sendmsg::<()>(
                            child_end.as_raw_fd(),
                            &[io::IoSlice::new(text.as_bytes())],
                            &[],
                            MsgFlags::empty(),
                            None,
                        )
                    }
                };
                // SAFETY: ends the child without running the helper's exit handlers.
                unsafe { libc::_exit(i32::from(sent.is_err())) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(child_end);
                let got = receive_listener(&ours);
                let _ = nix::sys::wait::waitpid(child, None);
                Ok(EgressRelays {
                    listener: got.map_err(HelperError::EgressListen)?,
                    upstream: Upstream::for_endpoint(endpoint)?,
                    relays: Vec::new(),
                })
            }
        }
    }

    pub(crate) fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Each relay's descriptors and what to wait for on them: readable while its buffer
    /// has room, writable while the other direction's buffer holds bytes.
    pub(crate) fn poll_fds(&self) -> Vec<(usize, BorrowedFd<'_>, PollFlags)> {
        let mut fds = Vec::new();
        for (slot, relay) in self.relays.iter().enumerate() {
            let Some(r) = relay else { continue };
            for (fd, reads, writes) in [(&r.client, &r.out, &r.back), (&r.upstream, &r.back, &r.out)] {
                let mut flags = PollFlags::empty();
                if !reads.closed && reads.end < reads.buf.len() {
                    flags |= PollFlags::POLLIN;
                }
                if !writes.is_empty() {
                    flags |= PollFlags::POLLOUT;
                }
                if !flags.is_empty() {
                    fds.push((slot, fd.as_fd(), flags));
                }
            }
        }
        fds
    }

    /// Takes the connections waiting on the listener, each relayed to a fresh
    /// connection to the host socket. Past `MAX_RELAYS`, or when the host socket
    /// refuses, a connection is closed at once: the program sees it reset.
    pub(crate) fn accept(&mut self) {
        loop {
            let client = match accept4(
                self.listener.as_raw_fd(),
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            ) {
                // SAFETY: accept4 returned a fresh descriptor, owned from here on.
                Ok(fd) => unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
                Err(_) => return,
            };
            if self.relays.iter().flatten().count() >= MAX_RELAYS {
                continue;
            }
            let Ok(upstream) = self.upstream.connect() else {
                continue;
            };
            let relay = Relay {
                client,
                upstream,
                out: Pipe::new(),
                back: Pipe::new(),
            };
            match self.relays.iter().position(Option::is_none) {
                Some(free) => self.relays[free] = Some(relay),
                None => self.relays.push(Some(relay)),
            }
        }
    }

    /// Moves what can be moved on relay `slot` after poll(2) found one of its ends ready, and
    /// closes the relay once both directions are done or either end failed.
    pub(crate) fn pump(&mut self, slot: usize) {
        let Some(Some(r)) = self.relays.get_mut(slot) else {
            return;
        };
        let ok = r.out.fill(&r.client).is_ok()
            && r.back.fill(&r.upstream).is_ok()
            && r.out.flush(&r.upstream).is_ok()
            && r.back.flush(&r.client).is_ok();
        if !ok || r.done() {
            self.relays[slot] = None;
        }
    }
}

/// The listener the child made, or its error.
fn receive_listener(from: &std::os::unix::net::UnixStream) -> io::Result<OwnedFd> {
    let mut buf = [0u8; 512];
    let (fd, len) = receive_fd(from.as_fd(), &mut buf, MsgFlags::empty())?;
    match fd {
        Some(fd) => Ok(fd),
        None => {
            let text = String::from_utf8_lossy(buf.get(1..len).unwrap_or_default()).into_owned();
            Err(io::Error::other(if text.is_empty() {
                "the listener's child failed".into()
            } else {
                text
            }))
        }
    }
}

/// One message from `from` into `buf`, and the descriptor that came with it, if any:
/// its length and the descriptor, owned.
fn receive_fd(from: BorrowedFd<'_>, buf: &mut [u8], flags: MsgFlags) -> io::Result<(Option<OwnedFd>, usize)> {
    let (bytes, fds, _) = crate::io::receive_fds::<1>(from.as_raw_fd(), buf, flags)?;
    Ok((fds.into_iter().next(), bytes))
}

/// Asks the server for a connection to the proxy over the egress channel `channel`
/// (`Egress::channel`) and waits for it: one byte out, one byte back with the
/// connection, or without one when the server could not connect.
fn ask_channel(channel: &OwnedFd) -> io::Result<OwnedFd> {
    send(channel.as_raw_fd(), b"c", MsgFlags::MSG_NOSIGNAL)?;
    let mut ready = [nix::poll::PollFd::new(channel.as_fd(), PollFlags::POLLIN)];
    if nix::poll::poll(&mut ready, nix::poll::PollTimeout::from(CHANNEL_WAIT_MS))? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the server did not answer on the egress channel",
        ));
    }
    // One byte: the answer to this question, not the next one's.
    let mut byte = [0u8; 1];
    match receive_fd(channel.as_fd(), &mut byte, MsgFlags::MSG_DONTWAIT)? {
        (Some(conn), 1) => {
            nix::fcntl::fcntl(
                conn.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )?;
            Ok(conn)
        }
        (_, 0) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the egress channel closed",
        )),
        _ => Err(io::Error::other("the server could not connect to the proxy")),
    }
}

/// The listener, made inside the run's network namespace.
fn listen_inside(port: u16) -> io::Result<OwnedFd> {
    loopback_up()?;
    // std's bind: close-on-exec, SO_REUSEADDR, a backlog of 128.
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))?;
    listener.set_nonblocking(true)?;
    Ok(OwnedFd::from(listener))
}

/// `ip link set lo up`, with the ioctl: a new network namespace's loopback is down.
fn loopback_up() -> io::Result<()> {
    let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `req` into it.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifru_flags is the union member SIOCGIFFLAGS just filled.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    // gVisor's kernel brings a new namespace's loopback up itself (and the helper has no
    // CAP_NET_ADMIN there).
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the name and flags from `req`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking connection to the proxy's host socket. A full backlog fails at once
/// (EAGAIN) instead of blocking the helper.
fn connect_host(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}
