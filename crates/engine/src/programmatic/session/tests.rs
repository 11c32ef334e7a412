//! The session state machine driven without sandboxes: a fake isolation tier hands out
//! scripted `HelperChannel`s, each the far end of a `Program` that the test plays (the
//! events it sends, the replies it reads), and the stores are in memory. No root, no
//! namespaces, no helper process.

use super::*;
use crate::isolation::{HelperChannel, IsolationTier, WarmSandbox};
use async_trait::async_trait;
use sandcall_store::memory::{MemoryFileStore, MemorySessionStore};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The test's end of one fake sandbox: it plays the program.
struct Program {
    events: mpsc::UnboundedSender<Event>,
    replies: mpsc::UnboundedReceiver<(u64, ToolReply)>,
    aborted: Arc<AtomicBool>,
}

impl Program {
    fn call(&self, key: u64, name: &str, arguments: Value) {
        let event = Event::ToolCall {
            key,
            name: name.into(),
            arguments: Some(arguments),
            argv: None,
        };
        self.events.send(event).unwrap();
    }

    /// The program waits for its calls' results, having printed `stdout`.
    fn block(&self, stdout: &str) {
        let event = Event::Blocked {
            partial_stdout: stdout.into(),
            partial_stderr: String::new(),
        };
        self.events.send(event).unwrap();
    }

    fn finish(&self, stdout: &str) {
        let result = RunResult {
            exit_code: Some(0),
            stdout: stdout.into(),
            ..RunResult::default()
        };
        self.events.send(Event::Finished { result }).unwrap();
    }

    /// The next reply the program receives.
    async fn reply(&mut self) -> (u64, ToolReply) {
        within(self.replies.recv()).await.expect("the sandbox is gone")
    }

    /// No reply is waiting for the program.
    fn no_reply(&mut self) -> bool {
        self.replies.try_recv().is_err()
    }

    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

/// `f`, or a panic after 30 s (of the paused clock, where a test pauses it): a test
/// whose behaviour is missing fails rather than hangs.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("nothing happened within 30 s")
}

/// The driver's end of a fake sandbox.
struct FakeHelper {
    run_id: String,
    events: mpsc::UnboundedReceiver<Event>,
    replies: mpsc::UnboundedSender<(u64, ToolReply)>,
    aborted: Arc<AtomicBool>,
    abort_signal: tokio::sync::Notify,
    /// Whether the `Finished` that follows an abort was given.
    ended: bool,
    /// Whether an abort waits for the program's next event before the run ends.
    linger: bool,
}

#[async_trait]
impl HelperChannel for FakeHelper {
    fn run_id(&self) -> &str {
        &self.run_id
    }

    fn hash_seed(&self) -> Option<u32> {
        None
    }

    async fn next_event(&mut self) -> Result<Event, RunError> {
        if !self.aborted.load(Ordering::SeqCst) {
            tokio::select! {
                event = self.events.recv() => {
                    return event.ok_or_else(|| RunError::Protocol("the program is gone".into()));
                }
                _ = self.abort_signal.notified() => {}
            }
        }
        // Aborted: the program is killed, as a real helper's is, and its run ends.
        if self.ended {
            return std::future::pending().await;
        }
        // A sandbox that takes its time to stop: it ends when the test's program says.
        if self.linger {
            let _ = self.events.recv().await;
        }
        self.ended = true;
        let result = RunResult {
            aborted: true,
            ..RunResult::default()
        };
        Ok(Event::Finished { result })
    }

    async fn send(&mut self, command: &Command) -> Result<(), RunError> {
        let Command::Reply { key, reply } = command;
        let _ = self.replies.send((*key, reply.clone()));
        Ok(())
    }

    fn abort(&mut self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.abort_signal.notify_one();
    }

    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Nothing to reclaim: a fake sandbox is gone with its driver.
    async fn wait(&mut self) {}
}

/// A tier with no warm sandboxes, whose every run is a `FakeHelper`; the test gets the
/// `Program` of each.
struct FakeTier {
    programs: mpsc::UnboundedSender<Program>,
    started: AtomicUsize,
    /// Sandboxes stop only when their program sends one more event after an abort.
    linger: AtomicBool,
}

#[async_trait]
impl IsolationTier for FakeTier {
    async fn take_warm(&self, _: &str, _: sandcall_api::Language, _: &str) -> Option<Box<dyn WarmSandbox>> {
        None
    }

    async fn start(&self, spec: RunSpec) -> Result<Box<dyn HelperChannel>, RunError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let (events_tx, events) = mpsc::unbounded_channel();
        let (replies, replies_rx) = mpsc::unbounded_channel();
        let aborted = Arc::new(AtomicBool::new(false));
        let program = Program {
            events: events_tx,
            replies: replies_rx,
            aborted: aborted.clone(),
        };
        let _ = self.programs.send(program);
        Ok(Box::new(FakeHelper {
            run_id: spec.run_id,
            events,
            replies,
            aborted,
            abort_signal: tokio::sync::Notify::new(),
            ended: false,
            linger: self.linger.load(Ordering::SeqCst),
        }))
    }

    async fn run(
        &self,
        _: Option<Box<dyn WarmSandbox>>,
        _: RunSpec,
        _: Box<dyn std::any::Any + Send>,
    ) -> Result<RunResult, RunError> {
        Err(RunError::Protocol("sessions drive their sandboxes themselves".into()))
    }

    fn failing(&self) -> Option<String> {
        None
    }

    fn record_failure(&self, _: &RunError) {}
}

struct Harness {
    sessions: Sessions,
    programs: mpsc::UnboundedReceiver<Program>,
    tier: Arc<FakeTier>,
    _shutdown: watch::Sender<bool>,
    dir: PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn harness(tool_call_timeout_ms: u64, session_expiry_s: u64) -> Harness {
    let dir = std::env::temp_dir().join(format!("sandcall-session-test-{}", ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = Config {
        sessions: sandcall_config::SessionsConfig {
            tool_call_timeout_ms,
            session_expiry_s,
            session_idle_evict_s: 0,
            ..Default::default()
        },
        ..Config::default()
    };
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (programs_tx, programs) = mpsc::unbounded_channel();
    let tier = Arc::new(FakeTier {
        programs: programs_tx,
        started: AtomicUsize::new(0),
        linger: AtomicBool::new(false),
    });
    let key = TokenKey::load(Some(&"ab".repeat(32)), &dir).unwrap();
    let backing = Backing {
        tiers: crate::isolation::Tiers::new().with(Isolation::Namespace, tier.clone()),
        admission: Admission::new(4, 16, Duration::from_secs(5), 4),
        files: Arc::new(MemoryFileStore::new(dir.join("files"))),
        outbox_dir: dir.join("outbox"),
        store: Arc::new(MemorySessionStore::new()),
        node: None,
        egress: None,
    };
    Harness {
        sessions: Sessions::new(key, Arc::new(config), shutdown, backing),
        programs,
        tier,
        _shutdown: shutdown_tx,
        dir,
    }
}

fn principal() -> Principal {
    Principal("alice".into())
}

fn get_tool() -> Value {
    json!({
        "name": "get",
        "description": "gets",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    })
}

fn start_command(h: &Harness) -> StartCommand {
    let request = serde_json::from_value(json!({
        "language": "python",
        "code": "print(get(n=1))",
        "tools": [get_tool()],
    }))
    .unwrap();
    super::super::parse_start(request, &h.sessions.inner.config).unwrap()
}

fn result(call_id: &str, value: Value) -> ToolResult {
    ToolResult {
        call_id: call_id.into(),
        result: serde_json::value::to_raw_value(&value).unwrap(),
        is_error: false,
        error_message: None,
    }
}

fn parse(json: &Bytes) -> Value {
    serde_json::from_slice(json).unwrap()
}

/// Starts a session whose program calls `get` once per key of `keys` and blocks:
/// answers the first pause and the program's end of the sandbox.
async fn start_paused(h: &mut Harness, keys: &[u64]) -> (Value, Program) {
    let sessions = h.sessions.clone();
    let cmd = start_command(h);
    let started = tokio::spawn(async move { sessions.start(&principal(), Isolation::Namespace, cmd).await });
    let program = h.programs.recv().await.unwrap();
    for key in keys {
        program.call(*key, "get", json!({"n": key}));
    }
    program.block("before\n");
    let paused = parse(&within(started).await.unwrap().unwrap());
    (paused, program)
}

/// Sends a resume in a task of its own (it answers once the program pauses or ends).
fn resume(h: &Harness, paused: &Value, results: Vec<ToolResult>) -> JoinHandle<Result<(Bytes, Served), EngineError>> {
    let sessions = h.sessions.clone();
    let token = paused["continuation_token"].as_str().unwrap().to_owned();
    tokio::spawn(async move { within(sessions.resume(&principal(), &token, None, results, None)).await })
}

fn call_id(paused: &Value, i: usize) -> String {
    paused["tool_calls"][i]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_tool_call_pauses_the_session_with_the_call() {
    let mut h = harness(60_000, 3600);
    let (paused, program) = start_paused(&mut h, &[1]).await;
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let calls = paused["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{paused}");
    assert_eq!(calls[0]["name"], "get");
    assert_eq!(calls[0]["arguments"], json!({"n": 1}));
    assert_eq!(paused["partial_stdout"], "before\n");
    assert!(paused["continuation_token"].as_str().is_some_and(|t| !t.is_empty()));
    // Paused: the session answers its pause to a GET, and its program still runs.
    let id = paused["session_id"].as_str().unwrap();
    let status = parse(&h.sessions.status(&principal(), id).await.unwrap());
    assert_eq!(status["status"], "tool_call_required");
    assert!(!program.aborted());
}

#[tokio::test]
async fn a_resume_hands_the_results_in_and_the_program_finishes() {
    let mut h = harness(60_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1]).await;
    let resumed = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!({"v": 42}))]);
    let (key, reply) = program.reply().await;
    assert_eq!(key, 1);
    assert!(reply.ok);
    assert_eq!(reply.result.as_ref().map(|r| r.get()), Some(r#"{"v":42}"#));
    program.finish("42\n");
    let (json, served) = resumed.await.unwrap().unwrap();
    let done = parse(&json);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "42\n");
    assert_eq!(done["tool_calls_made"], 1);
    assert_eq!(served.as_str(), "live");
}

#[tokio::test]
async fn a_partial_resume_leaves_the_other_call_for_the_next_pause() {
    let mut h = harness(60_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1, 2]).await;
    assert_eq!(paused["tool_calls"].as_array().unwrap().len(), 2, "{paused}");
    let (first, second) = (call_id(&paused, 0), call_id(&paused, 1));
    // Only the first call is answered: the program gets that one alone.
    let resumed = resume(&h, &paused, vec![result(&first, json!("one"))]);
    assert_eq!(program.reply().await.0, 1);
    program.block("");
    let again = parse(&resumed.await.unwrap().unwrap().0);
    assert_eq!(again["status"], "tool_call_required", "{again}");
    let calls = again["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{again}");
    assert_eq!(calls[0]["id"], second.as_str());
    assert!(program.no_reply());
    // The next pause's token answers the rest.
    let resumed = resume(&h, &again, vec![result(&second, json!("two"))]);
    assert_eq!(program.reply().await.0, 2);
    program.finish("done\n");
    let done = parse(&resumed.await.unwrap().unwrap().0);
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn a_retried_resume_gets_the_same_answer_and_runs_nothing_again() {
    let mut h = harness(60_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1]).await;
    let results = vec![result(&call_id(&paused, 0), json!({"v": 1}))];
    let first = resume(&h, &paused, results.clone());
    assert_eq!(program.reply().await.0, 1);
    // The program calls again: the resume's answer is the next pause.
    program.call(2, "get", json!({"n": 2}));
    program.block("");
    let (answer, _) = first.await.unwrap().unwrap();
    assert_eq!(parse(&answer)["status"], "tool_call_required");
    // The same resume again (a client retrying after a lost answer).
    let (again, _) = resume(&h, &paused, results).await.unwrap().unwrap();
    assert_eq!(again, answer, "a retry is answered what the first resume was");
    assert!(program.no_reply(), "a retry's results reach the program once");
    // Other results with the same token are refused.
    let other = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!({"v": 2}))]);
    let refused = other.await.unwrap().unwrap_err();
    assert_eq!(refused.kind, ErrorKind::Conflict, "{}", refused.message);
}

#[tokio::test]
async fn a_call_nobody_answers_times_out_in_the_program() {
    tokio::time::pause();
    let mut h = harness(1_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1]).await;
    let id = paused["session_id"].as_str().unwrap().to_owned();
    // Nobody resumes: after tool_call_timeout the program gets a timeout for its call.
    let (key, reply) = program.reply().await;
    assert_eq!(key, 1);
    assert!(!reply.ok);
    assert_eq!(reply.kind.as_deref(), Some("timeout"));
    // Its token is stale from then on.
    let late = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!(1))]);
    assert!(late.await.unwrap().is_err());
    let session = h.sessions.map().get(&id).cloned().unwrap();
    let seen = *session.version.borrow();
    program.finish("gave up\n");
    let done = parse(&within(session.next_outcome_json(seen)).await.unwrap());
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "gave up\n");
    assert!(!program.aborted());
}

#[tokio::test]
async fn a_cancel_stops_the_program_and_ends_the_session() {
    let mut h = harness(60_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1]).await;
    let id = paused["session_id"].as_str().unwrap();
    let ended = within(h.sessions.cancel(&principal(), id)).await.unwrap();
    match ended {
        ProgrammaticResponse::Error { error_type, .. } => assert_eq!(error_type, error_type::CANCELLED),
        other => panic!("cancel answered {other:?}"),
    }
    assert!(program.aborted(), "the sandbox is told to stop");
    // The ended session answers its ending, to a GET and to a late resume, whose
    // results go nowhere.
    let status = parse(&h.sessions.status(&principal(), id).await.unwrap());
    assert_eq!(status["error_type"], error_type::CANCELLED);
    let late = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!(1))]);
    let late = parse(&late.await.unwrap().unwrap().0);
    assert_eq!(late["error_type"], error_type::CANCELLED, "{late}");
    assert!(program.no_reply());
    assert_eq!(h.tier.started.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_paused_session_nobody_resumes_expires() {
    tokio::time::pause();
    let mut h = harness(3_600_000, 2);
    let (paused, program) = start_paused(&mut h, &[1]).await;
    let id = paused["session_id"].as_str().unwrap().to_owned();
    let session = h.sessions.map().get(&id).cloned().unwrap();
    let seen = *session.version.borrow();
    let ended = parse(&within(session.next_outcome_json(seen)).await.unwrap());
    assert_eq!(ended["error_type"], error_type::SESSION_EXPIRED, "{ended}");
    assert!(program.aborted(), "the sandbox is reclaimed");
    // Gone: resuming or reading it finds no session.
    let missing = h.sessions.status(&principal(), &id).await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert_eq!(h.sessions.entries(), 0);
}

#[tokio::test]
async fn between_its_expiry_and_its_removal_a_session_answers_not_found() {
    let mut h = harness(60_000, 3600);
    let (paused, mut program) = start_paused(&mut h, &[1]).await;
    let id = paused["session_id"].as_str().unwrap().to_owned();
    let session = h.sessions.map().get(&id).cloned().unwrap();
    // What the expiry timer does first; the registry lets go of the session after.
    assert!(session.leave_pause(Phase::Expired));
    assert_eq!(h.sessions.entries(), 1, "still held here");
    let status = h.sessions.status(&principal(), &id).await.unwrap_err();
    assert_eq!(status.kind, ErrorKind::NotFound, "GET answers 404, not running");
    let late = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!(1))]);
    assert_eq!(late.await.unwrap().unwrap_err().kind, ErrorKind::NotFound);
    let cancel = h.sessions.cancel(&principal(), &id).await.unwrap_err();
    assert_eq!(cancel.kind, ErrorKind::NotFound);
    assert!(program.no_reply(), "no result reaches the program");
}

#[tokio::test]
async fn a_resume_that_arrives_as_the_loop_ends_answers_the_ending() {
    tokio::time::pause();
    let mut h = harness(3_600_000, 3600);
    h.tier.linger.store(true, Ordering::SeqCst);
    let sessions = h.sessions.clone();
    let mut cmd = start_command(&h);
    cmd.loop_timeout_ms = Some(5_000);
    let started = tokio::spawn(async move { sessions.start(&principal(), Isolation::Namespace, cmd).await });
    let program = h.programs.recv().await.unwrap();
    program.call(1, "get", json!({"n": 1}));
    program.block("before\n");
    let paused = parse(&within(started).await.unwrap().unwrap());
    // The loop's time runs out while paused: the sandbox is told to stop, and takes
    // its time.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(program.aborted());
    let late = resume(&h, &paused, vec![result(&call_id(&paused, 0), json!(1))]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !late.is_finished(),
        "the resume waits for the ending (it used to get 409)"
    );
    program.finish("");
    let answer = parse(&late.await.unwrap().unwrap().0);
    assert_eq!(answer["error_type"], error_type::TIMEOUT, "{answer}");
}
