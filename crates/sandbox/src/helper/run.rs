//! The helper's side of a run while its program runs (`Sandbox::run`): one poll(2)
//! loop over the program's stdio, init's reports, the server's control lines and the
//! tool channel, until the program has ended and its output is drained.

use super::{emit, emit_line, HelperError, InitReport, InitRun, Sandbox};
use crate::io::{read_some, set_nonblocking, timeout_of, write_all, Capture, Lines, MAX_SHORT_LINE};
use crate::protocol::{Event, Run, RunResult};
use nix::poll::{poll, PollFd, PollFlags};
use nix::sys::signal::Signal;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// While tool calls wait unannounced, how often to look whether the program sleeps,
/// and how many looks in a row must find it asleep.
const QUIET_CHECK_EVERY: Duration = Duration::from_millis(3);
const QUIET_CHECKS_NEEDED: u32 = 4;
/// How often the run's CPU time is compared with its budget.
const CPU_CHECK_EVERY: Duration = Duration::from_millis(50);
/// After init is gone, how long to wait for the output pipes to close.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

impl Sandbox {
    /// Runs the program and collects its output until it ends, its time runs out, or
    /// the server aborts. Tool calls are relayed in between.
    pub(super) fn run(&mut self, run: &Run, control: &mut Lines) -> Result<RunResult, HelperError> {
        self.write_code(run)?;
        self.staged = crate::workspace::stage(
            &self.work_dir(),
            &run.inputs,
            self.owner.0,
            self.owner.1,
            self.forked.is_some(),
        )?;
        // The way out, listening before the program can start (it could take the port).
        if let Some(endpoint) = &run.egress {
            let ns = self.net_ns.take().ok_or(HelperError::EgressWithoutNamespace)?;
            self.egress = Some(super::egress::EgressRelays::open(&ns, endpoint)?);
        }
        let mut go_pending: Option<(OwnedFd, Vec<u8>)> = None;
        match self.go_w.take() {
            // Launched ahead: the program waits on fd 3 for its go.
            Some(go) => {
                self.cpu_before_run = self.cgroup.as_ref().map_or(0, |c| c.cpu_time_ms());
                let mut line = run.go.clone().unwrap_or_default().into_bytes();
                line.push(b'\n');
                go_pending = Some((go, line));
            }
            None => self.start_program(&InitRun::new(&run.argv, &run.env))?,
        }
        let mut running = Running::new(self, run)?;
        // What starts the program comes last, once the helper has nothing left to do
        // but wait: the process it wakes can take this CPU from the helper (traced on a
        // busy machine: 4.8 ms between the seal and the go, the helper preempted by
        // the init it had just woken).
        if let Some((go, line)) = go_pending.take() {
            // A program that died before its go shows up as its exit status.
            let _ = write_all(&go, &line);
            let _ = set_nonblocking(&go);
            // Its messages are a few bytes: a program that floods it is cut off after
            // MAX_SHORT_LINE, not after the control channel's cap.
            running.status_fd = Some(Lines::new(go, MAX_SHORT_LINE));
        }
        if self.forked.is_some() {
            // A forked run's code directory is its own tmpfs, writable until now. Its
            // program waits for its init's release before it reads the go just sent
            // (which woke no one); init releases it only once it has remounted the
            // directory read-only. One message, no round trip (zygote.py, `_run_init`).
            let to_init = self.to_init.as_ref().ok_or(HelperError::InitChannelClosed)?;
            write_all(to_init, b"seal\n").map_err(HelperError::SealCode)?;
        }
        running.watch(self, control)?;
        Ok(running.finish())
    }

    /// Writes the run's code and support files into the code directory.
    fn write_code(&self, run: &Run) -> Result<(), HelperError> {
        if run.code.len() as u64 > self.max_code_bytes {
            return Err(HelperError::CodeTooLarge);
        }
        let files = std::iter::once((&run.code_file, &run.code)).chain(run.support_files.iter().map(|(n, c)| (n, c)));
        for (name, content) in files {
            if name.contains('/') || name.is_empty() || name == "tools.sock" || name == "bin" {
                return Err(HelperError::BadCodeFileName(name.clone()));
            }
            let path = self.code_dir().join(name);
            self.as_owner(|| fs::write(&path, content))
                .map_err(|source| HelperError::WriteCodeFile {
                    name: name.clone(),
                    source,
                })?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).map_err(|source| {
                HelperError::ChmodCodeFile {
                    name: name.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }
}

/// A run while its program runs (`Sandbox::run`): its pipes, its clocks, and what the
/// helper has seen of it so far.
struct Running<'r> {
    /// A launched program says on fd 3 when it ends; that ends the run at once,
    /// without waiting for the kernel to tear the process down.
    status_fd: Option<Lines>,
    ended_by_program: bool,
    start: Instant,
    /// In a run with tools, `timeout_ms` bounds the time the program runs, not the
    /// time it waits for its caller: the clock stops when the helper reports the
    /// program blocked on its calls (`Blocked`) and starts again with the next reply,
    /// and the deadline moves by the time it stood. Threads that go on working while
    /// the calls are out are bounded by the CPU budget, and the wait itself by the
    /// server's tool_call_timeout and session expiry.
    deadline: Instant,
    clock_stopped: Option<Instant>,
    cpu_budget: u64,
    out: Streams,
    result: RunResult,
    stdin_data: &'r [u8],
    stdin_w: Option<OwnedFd>,
    stdout_r: Option<OwnedFd>,
    stderr_r: Option<OwnedFd>,
    control_open: bool,
    /// When the program was seen to end (its exit reported, or init gone), and when
    /// the helper killed it; either starts the grace period for draining output.
    ended_at: Option<Instant>,
    killed_at: Option<Instant>,
    next_cpu_check: Instant,
    quiet_checks: u32,
}

impl<'r> Running<'r> {
    /// Starts the run's clock and takes the program's stdio pipes from the sandbox.
    fn new(sb: &mut Sandbox, run: &'r Run) -> Result<Self, HelperError> {
        let start = Instant::now();
        let stdin_data: &[u8] = run.stdin.as_bytes();
        let stdin_w = sb.stdin_w.take().filter(|_| !stdin_data.is_empty());
        if let Some(w) = &stdin_w {
            set_nonblocking(w).map_err(HelperError::SetNonblocking)?;
        }
        let stdout_r = sb.stdout_r.take();
        let stderr_r = sb.stderr_r.take();
        for fd in [&stdout_r, &stderr_r].into_iter().flatten() {
            set_nonblocking(fd).map_err(HelperError::SetNonblocking)?;
        }
        Ok(Running {
            status_fd: None,
            ended_by_program: false,
            start,
            deadline: start + Duration::from_millis(run.timeout_ms),
            clock_stopped: None,
            cpu_budget: sb.limits.cpu_time_ms,
            out: Streams::new(sb.limits.max_output_bytes as usize),
            result: RunResult::default(),
            stdin_data,
            stdin_w,
            stdout_r,
            stderr_r,
            control_open: true,
            ended_at: None,
            killed_at: None,
            next_cpu_check: start + CPU_CHECK_EVERY,
            quiet_checks: 0,
        })
    }

    /// The poll loop: waits for output, init's reports, the server and the tool
    /// channel, until the program has ended and its output is drained (or the grace
    /// period for that is over).
    fn watch(&mut self, sb: &mut Sandbox, control: &mut Lines) -> Result<(), HelperError> {
        loop {
            let init_open = sb.from_init.as_ref().is_some_and(|l| !l.eof);
            if !init_open && self.stdout_r.is_none() && self.stderr_r.is_none() {
                break;
            }
            let now = Instant::now();
            let settled = self.ended_at.or(self.killed_at);
            if settled.is_some_and(|t| now >= t + DRAIN_GRACE) {
                break;
            }
            let wake = self.wake_at(sb, now, settled);
            let Some(fired) = self.wait(sb, control, wake.saturating_duration_since(now))? else {
                continue;
            };
            for source in fired {
                self.handle(source, sb, control)?;
            }

            // Lines that waited for a token, now that one came.
            if let Some(hub) = sb.tools.as_mut() {
                for event in hub.pump() {
                    emit_line(&event);
                    self.quiet_checks = 0;
                }
            }
            if settled.is_none() {
                self.notice_blocked(sb);
            }

            if self.ended_by_program {
                self.out.drain(&mut self.stdout_r, false);
                self.out.drain(&mut self.stderr_r, true);
                break;
            }
            self.enforce_limits(sb);
        }
        Ok(())
    }

    /// Decides how long the next wait may last.
    fn wake_at(&self, sb: &mut Sandbox, now: Instant, settled: Option<Instant>) -> Instant {
        let running_until = if self.clock_stopped.is_some() {
            // No deadline while the clock stands: the CPU check still wakes us.
            now + Duration::from_secs(3600)
        } else {
            self.deadline
        };
        let mut wake = settled.map_or(running_until, |t| t + DRAIN_GRACE);
        if settled.is_none() && self.cpu_budget > 0 {
            wake = wake.min(self.next_cpu_check);
        }
        let waiting_for_quiet = settled.is_none() && sb.tools.as_ref().is_some_and(|t| t.unannounced && !t.flush);
        if waiting_for_quiet {
            wake = wake.min(now + QUIET_CHECK_EVERY);
        }
        if let Some(token_at) = sb.tools.as_mut().and_then(|hub| hub.prepare_poll(now)) {
            wake = wake.min(token_at);
        }
        wake
    }

    /// One poll(2) over everything the run waits for. Returns what fired, or None when
    /// a signal interrupted the wait.
    fn wait(&self, sb: &Sandbox, control: &Lines, timeout: Duration) -> Result<Option<Vec<Source>>, HelperError> {
        let mut fds: Vec<PollFd> = Vec::new();
        let mut what: Vec<Source> = Vec::new();
        if let Some(fd) = &self.stdout_r {
            push_poll(&mut fds, &mut what, fd.as_fd(), PollFlags::POLLIN, Source::Stdout);
        }
        if let Some(fd) = &self.stderr_r {
            push_poll(&mut fds, &mut what, fd.as_fd(), PollFlags::POLLIN, Source::Stderr);
        }
        if let Some(fd) = &self.stdin_w {
            push_poll(&mut fds, &mut what, fd.as_fd(), PollFlags::POLLOUT, Source::Stdin);
        }
        if let Some(l) = sb.from_init.as_ref().filter(|l| !l.eof) {
            push_poll(&mut fds, &mut what, l.fd.as_fd(), PollFlags::POLLIN, Source::Init);
        }
        if self.control_open {
            push_poll(
                &mut fds,
                &mut what,
                control.fd.as_fd(),
                PollFlags::POLLIN,
                Source::Control,
            );
        }
        if let Some(status) = self.status_fd.as_ref().filter(|l| !l.eof) {
            push_poll(
                &mut fds,
                &mut what,
                status.fd.as_fd(),
                PollFlags::POLLIN,
                Source::Status,
            );
        }
        if let Some(hub) = &sb.tools {
            push_poll(
                &mut fds,
                &mut what,
                hub.listener_fd(),
                PollFlags::POLLIN,
                Source::Listener,
            );
            // Connections that hold much unread reply, wait for a share of the input
            // budget, or wait for a token are not read: they only slow themselves.
            for (slot, fd, flags) in hub.conn_fds() {
                push_poll(&mut fds, &mut what, fd, flags, Source::Conn(slot));
            }
        }
        if let Some(relays) = &sb.egress {
            push_poll(
                &mut fds,
                &mut what,
                relays.listener_fd(),
                PollFlags::POLLIN,
                Source::EgressListener,
            );
            for (slot, fd, flags) in relays.poll_fds() {
                push_poll(&mut fds, &mut what, fd, flags, Source::Egress(slot));
            }
        }
        match poll(&mut fds, timeout_of(Some(timeout))) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(None),
            Err(e) => return Err(HelperError::Poll(e)),
        }
        Ok(Some(
            fds.iter()
                .zip(what)
                .filter(|(f, _)| f.revents().is_some_and(|r| !r.is_empty()))
                .map(|(_, w)| w)
                .collect(),
        ))
    }

    /// Handles one descriptor that poll(2) found ready.
    fn handle(&mut self, source: Source, sb: &mut Sandbox, control: &mut Lines) -> Result<(), HelperError> {
        match source {
            Source::Stdout => {
                self.out.read(&mut self.stdout_r, false);
            }
            Source::Stderr => {
                self.out.read(&mut self.stderr_r, true);
            }
            Source::Stdin => self.feed_stdin(),
            Source::Status => self.read_status(sb),
            Source::Init => self.read_init_reports(sb)?,
            Source::Control => self.read_control(sb, control),
            Source::Listener => {
                if let Some(hub) = sb.tools.as_mut() {
                    hub.accept();
                }
            }
            Source::EgressListener => {
                if let Some(relays) = sb.egress.as_mut() {
                    relays.accept();
                }
            }
            Source::Egress(slot) => {
                if let Some(relays) = sb.egress.as_mut() {
                    relays.pump(slot);
                }
            }
            Source::Conn(slot) => {
                if let Some(hub) = sb.tools.as_mut() {
                    hub.flush_out(slot);
                    for event in hub.read(slot) {
                        emit_line(&event);
                        self.quiet_checks = 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the next piece of the run's stdin.
    fn feed_stdin(&mut self) {
        if let Some(w) = self.stdin_w.as_ref() {
            let data = self.stdin_data;
            match nix::unistd::write(w, &data[..data.len().min(64 * 1024)]) {
                Ok(n) => self.stdin_data = &data[n..],
                Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => self.stdin_data = &[],
            }
            if self.stdin_data.is_empty() {
                self.stdin_w = None;
            }
        }
    }

    /// A launched program's own report of its end (`exit N`) on fd 3.
    fn read_status(&mut self, sb: &Sandbox) {
        let mut misused = false;
        if let Some(status) = self.status_fd.as_mut() {
            // A program that floods its fd 3 just loses the channel.
            misused = status.fill().is_err();
            while let Some(line) = status.take_line().filter(|_| !misused) {
                if line.len() > 32 {
                    misused = true;
                    break;
                }
                let code = std::str::from_utf8(&line)
                    .ok()
                    .and_then(|l| l.strip_prefix("exit "))
                    .and_then(|n| n.trim().parse::<i32>().ok());
                if let (Some(code), None) = (code, self.ended_at) {
                    // The program has flushed its output and is about to
                    // exit: its output is in the pipes, and whatever it
                    // leaves behind dies now.
                    self.result.exit_code = Some(code);
                    self.ended_at = Some(Instant::now());
                    self.ended_by_program = true;
                    sb.kill_init();
                }
            }
        }
        if misused {
            self.status_fd = None;
        }
    }

    /// Init's reports of the program's end.
    fn read_init_reports(&mut self, sb: &mut Sandbox) -> Result<(), HelperError> {
        let mut kill = false;
        let forked = sb.forked.is_some();
        let lines = sb.from_init.as_mut().ok_or(HelperError::InitPipeClosed)?;
        let _ = lines.fill();
        while let Some(line) = lines.take_line() {
            match serde_json::from_slice::<InitReport>(&line) {
                Ok(InitReport::Exited { code }) => {
                    self.result.exit_code = Some(code);
                    self.ended_at.get_or_insert_with(Instant::now);
                    // The run is over: whatever it left behind dies now,
                    // while the output drains.
                    kill = true;
                }
                Ok(InitReport::Signaled { signal }) => {
                    self.result.signal = Some(signal_name(signal));
                    self.ended_at.get_or_insert_with(Instant::now);
                    kill = true;
                }
                // A forked run's init could not seal the code: the
                // program was never released.
                Ok(InitReport::SetupFailed { message }) if forked => {
                    sb.kill_init();
                    return Err(HelperError::SetupFailed(message));
                }
                _ => {}
            }
        }
        if lines.eof {
            self.ended_at.get_or_insert_with(Instant::now);
        }
        if kill {
            sb.kill_init();
        }
        Ok(())
    }

    /// The server's commands: replies to tool calls, and the end of the control pipe,
    /// which aborts the run.
    fn read_control(&mut self, sb: &mut Sandbox, control: &mut Lines) {
        let _ = control.fill();
        while let Some(line) = control.take_line() {
            if let Some(hub) = sb.tools.as_mut() {
                let reply = hub.command(&line);
                // A reply wakes the program: its clock runs again, and
                // the deadline moves by the time it stood.
                if let (true, Some(stopped)) = (reply, self.clock_stopped) {
                    self.deadline += stopped.elapsed();
                    self.clock_stopped = None;
                }
                // Calls made while the program was paused were announced
                // then, and held by the server; they are due at the next
                // pause, so the next wait must be reported again.
                if reply && hub.has_pending() {
                    hub.unannounced = true;
                }
            }
        }
        // End of file on the control pipe means abort.
        if control.eof {
            self.control_open = false;
            if self.killed_at.is_none() && self.ended_at.is_none() {
                self.result.aborted = true;
                sb.kill_init();
                self.killed_at = Some(Instant::now());
            }
        }
    }

    /// The program waits for its calls when it says so (Python's runner), or when
    /// every one of its threads sleeps (Bash tool commands in the background): then
    /// the server is told (`Blocked`, with the output since the last pause) and the
    /// run's clock stops.
    fn notice_blocked(&mut self, sb: &mut Sandbox) {
        if let Some(hub) = sb.tools.as_mut() {
            let mut blocked = hub.unannounced && hub.flush;
            if hub.unannounced && !hub.flush && hub.has_pending() {
                // A program halfway through sending a message sleeps in its
                // write while the helper reads; it is not waiting for its calls.
                let idle = !hub.receiving() && sb.cgroup.as_ref().is_some_and(|c| c.all_sleeping());
                self.quiet_checks = if idle { self.quiet_checks + 1 } else { 0 };
                blocked = self.quiet_checks >= QUIET_CHECKS_NEEDED;
            }
            if blocked {
                // Output printed before the call is in the pipes by now.
                self.out.drain(&mut self.stdout_r, false);
                self.out.drain(&mut self.stderr_r, true);
                let (partial_stdout, partial_stderr) = self.out.take_partial();
                emit(&Event::Blocked {
                    partial_stdout,
                    partial_stderr,
                });
                hub.unannounced = false;
                hub.flush = false;
                self.quiet_checks = 0;
                self.clock_stopped.get_or_insert_with(Instant::now);
            } else if !hub.unannounced {
                hub.flush = false;
            }
        }
    }

    /// Kills a program past its deadline or over its CPU budget.
    fn enforce_limits(&mut self, sb: &Sandbox) {
        let now = Instant::now();
        if self.killed_at.is_none() && self.ended_at.is_none() {
            if self.clock_stopped.is_none() && now >= self.deadline {
                self.result.timed_out = true;
                sb.kill_init();
                self.killed_at = Some(now);
            } else if self.cpu_budget > 0 && now >= self.next_cpu_check {
                self.next_cpu_check = now + CPU_CHECK_EVERY;
                let before = sb.cpu_before_run;
                if sb
                    .cgroup
                    .as_ref()
                    .is_some_and(|c| c.cpu_time_ms().saturating_sub(before) > self.cpu_budget)
                {
                    self.result.cpu_limit_exceeded = true;
                    sb.kill_init();
                    self.killed_at = Some(now);
                }
            }
        }
    }

    /// The run's result, once the loop is over: how it ended, its wall time, its output.
    fn finish(mut self) -> RunResult {
        let result = &mut self.result;
        if self.killed_at.is_some() && result.exit_code.is_none() && result.signal.is_none() {
            result.signal = Some("SIGKILL".into());
        }
        // Wall time runs until the program was seen gone, so a late kill shows.
        result.wall_time_ms = self
            .ended_at
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.start)
            .as_millis() as u64;
        self.out.finish(result);
        self.result
    }
}

/// What a descriptor in the poll set is.
#[derive(Clone, Copy)]
enum Source {
    Status,
    Stdout,
    Stderr,
    Stdin,
    Init,
    Control,
    Listener,
    Conn(usize),
    EgressListener,
    Egress(usize),
}

/// The program's stdout and stderr: the whole run's (capped) and, for tool-call
/// pauses, what came since the last pause (capped the same way).
struct Streams {
    cap: usize,
    total: [Capture; 2],
    partial: [Capture; 2],
    chunk: Vec<u8>,
}

impl Streams {
    fn new(cap: usize) -> Self {
        Streams {
            cap,
            total: Default::default(),
            partial: Default::default(),
            chunk: vec![0u8; 64 * 1024],
        }
    }

    /// One read from a pipe; closes it at end of file. Returns whether data came.
    fn read(&mut self, pipe: &mut Option<OwnedFd>, stderr: bool) -> bool {
        let Some(fd) = pipe.as_ref() else { return false };
        let i = usize::from(stderr);
        match read_some(fd, &mut self.chunk) {
            Ok(0) => {
                *pipe = None;
                false
            }
            Ok(n) => {
                self.total[i].push(&self.chunk[..n], self.cap);
                self.partial[i].push(&self.chunk[..n], self.cap);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(_) => {
                *pipe = None;
                false
            }
        }
    }

    /// Reads everything a pipe holds right now.
    fn drain(&mut self, pipe: &mut Option<OwnedFd>, stderr: bool) {
        while self.read(pipe, stderr) {}
    }

    fn take_partial(&mut self) -> (String, String) {
        let [o, e] = std::mem::take(&mut self.partial);
        (o.text(), e.text())
    }

    fn finish(&self, result: &mut RunResult) {
        result.stdout = self.total[0].text();
        result.stderr = self.total[1].text();
        result.stdout_truncated = self.total[0].truncated;
        result.stderr_truncated = self.total[1].truncated;
    }
}

fn signal_name(signal: i32) -> String {
    Signal::try_from(signal)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("SIG{signal}"))
}

fn push_poll<'a>(
    fds: &mut Vec<PollFd<'a>>,
    what: &mut Vec<Source>,
    fd: BorrowedFd<'a>,
    flags: PollFlags,
    source: Source,
) {
    fds.push(PollFd::new(fd, flags));
    what.push(source);
}
