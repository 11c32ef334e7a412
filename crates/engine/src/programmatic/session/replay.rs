//! Bringing a session back from its journal: recovery at start, and the driver of a
//! program that runs again, answered from the journal up to its last pause.

use super::*;
use crate::isolation::HelperChannel;

/// A resume of a dormant session: the pause it answered, its results by call id, and
/// their digest.
pub(super) struct Resumed {
    pub(super) pause: u64,
    /// None when the replies are the server's (tool_call_timeout_ms): no caller's resume
    /// can be retried then.
    pub(super) digest: Option<[u8; 32]>,
    pub(super) replies: Vec<(String, ToolReply)>,
    /// What to go back to if the store cannot record the replies now.
    pub(super) undo: Option<Undo>,
}

/// What a replay still has to meet: the journalled calls the program has not made
/// again yet, the replies known for calls, and the output the caller already has.
pub(super) struct Replay {
    /// (pause, call id, name, arguments), in the order they were handed out.
    pub(super) calls: std::collections::VecDeque<(u64, String, String, Value)>,
    pub(super) replies: HashMap<String, ToolReply>,
    pub(super) skip_stdout: u64,
    pub(super) skip_stderr: u64,
}

impl Replay {
    pub(super) fn new(entries: Vec<JournalEntry>, state: &SessionState) -> Replay {
        let mut calls = std::collections::VecDeque::new();
        let mut replies = HashMap::new();
        for entry in entries {
            match entry {
                JournalEntry::Call {
                    pause,
                    call_id,
                    name,
                    arguments,
                } => {
                    let arguments = serde_json::from_str(arguments.get()).unwrap_or(Value::Null);
                    calls.push_back((pause, call_id, name, arguments));
                }
                JournalEntry::Reply { call_id, reply } => {
                    replies.insert(call_id, reply);
                }
            }
        }
        Replay {
            calls,
            replies,
            skip_stdout: state.stdout_sent,
            skip_stderr: state.stderr_sent,
        }
    }

    /// The journalled call a call of the replayed program is: one of the earliest
    /// pause's calls not met yet, with the same name and arguments (the calls of one
    /// pause may come in any order, as Bash's background jobs make them). None: the
    /// program took another path.
    pub(super) fn meet(&mut self, name: &str, arguments: &str) -> Option<String> {
        let first = self.calls.front()?.0;
        let arguments: Value = serde_json::from_str(arguments).ok()?;
        let at = self
            .calls
            .iter()
            .take_while(|(pause, ..)| *pause == first)
            .position(|(_, _, n, a)| n == name && *a == arguments)?;
        self.calls.remove(at).map(|(_, call_id, ..)| call_id)
    }
}

impl Sessions {
    /// Brings the sessions journalled by an earlier server back: a paused one waits,
    /// dormant, for its resume, in the store alone (marked dormant there if its server
    /// ended without doing so, as after SIGKILL); one whose program was running (its last
    /// resume accepted, its next pause not reached) runs again to its next pause, which a
    /// retry of that resume then answers. A session that never paused is forgotten:
    /// nobody holds a token of it.
    pub async fn recover(&self) {
        let inner = &self.inner;
        // A store that many nodes share holds every node's sessions: each is looked up
        // by id when a request names it (`locate`), not taken at start.
        if inner.store.shared() {
            return;
        }
        let listed = match inner.store.list().await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::error!(error = %e, "could not read the session store: no session recovered");
                return;
            }
        };
        let mut recovered = 0usize;
        let expiry_ms = inner.config.sessions.session_expiry_s.saturating_mul(1000);
        for (id, principal, state) in listed {
            if state.open && state.pause > 0 {
                if now_ms().saturating_sub(state.paused_ms) > expiry_ms {
                    let held = self.workspace_of(&id).await;
                    let _ = inner.store.remove(&id).await;
                    self.let_go_workspace(held).await;
                    continue;
                }
                if self.keep_dormant(&id, principal, state.paused_ms).await {
                    recovered += 1;
                }
                continue;
            }
            if self.bring_back(id, principal, state).await {
                recovered += 1;
            }
        }
        if recovered > 0 {
            tracing::info!(recovered, "programmatic sessions recovered from the session store");
        }
    }

    pub(super) async fn replay_driver(
        &self,
        session: &Arc<Session>,
        resumed: Option<Resumed>,
    ) -> Result<(DriverSpec, Box<dyn HelperChannel>), String> {
        let inner = &self.inner;
        let id = &session.id;
        let journal = inner
            .store
            .load(id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("it is no longer journalled")?;
        // A replay would make the program's network requests again, blindly: a session
        // granted network is not replayed (docs/egress.md, "Replay").
        if journal.start.request.network.is_some() {
            return Err(NOT_REPLAYED_WITH_NETWORK.into());
        }
        let mut state = journal.state.clone();
        let mut entries = journal.entries;
        if let Some(resumed) = resumed {
            let answered: Vec<JournalEntry> = resumed
                .replies
                .into_iter()
                .map(|(call_id, reply)| JournalEntry::Reply { call_id, reply })
                .collect();
            state.open = false;
            state.outstanding.retain(|c| {
                !answered
                    .iter()
                    .any(|a| matches!(a, JournalEntry::Reply { call_id, .. } if call_id == c))
            });
            state.last_resume = resumed.digest.map(|digest| (resumed.pause, hex(&digest)));
            state.partial_stdout.clear();
            state.partial_stderr.clear();
            let consumed = inner.store.consume(id, resumed.pause, &answered, &state).await;
            if !consumed.map_err(|e| match e {
                sandcall_store::StoreError::Unavailable(detail) => format!("{STORE_UNAVAILABLE}: {detail}"),
                e => e.to_string(),
            })? {
                return Err(TOKEN_USED_ALREADY.into());
            }
            entries.extend(answered);
        }
        let replay = Replay::new(entries, &state);
        let config = inner.config.clone();
        let request = journal.start.request.clone();
        let cmd = tokio::task::spawn_blocking(move || super::super::parse_start(request, &config))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.message)?;
        // The tier the session started in (its journalled request names it; a journal
        // from before tiers, the server's).
        let isolation = cmd.isolation.unwrap_or(inner.config.host.isolation);
        let tier = inner
            .tiers
            .get(isolation)
            .cloned()
            .ok_or_else(|| format!("this server has no \"{}\" isolation tier", isolation.name()))?;
        let mut spec = cmd.spec;
        // The workspace, held again under the session's holder before anything runs:
        // if another run holds it now, the session cannot go on in it.
        let held = match journal.start.workspace.clone() {
            Some(journalled) => Some(
                self.hold_workspace_again(&session.principal, journalled, spec.timeout_ms)
                    .await
                    .map_err(|e| e.message)?,
            ),
            None => None,
        };
        spec.inputs = ops::resolve_inputs(
            &*inner.files,
            &session.principal,
            &cmd.files,
            spec.limits.workspace_bytes,
        )
        .await
        .map_err(|e| e.message)?;
        let staged = spec.inputs.clone();
        // A warm sandbox, as the first run had, when one hashes alike: a cold start (a
        // helper, namespaces, a cgroup, the interpreter and the preamble from nothing)
        // was most of a replayed resume's time (docs/scaling.md). A warm Python sandbox
        // built the usual way has a hash seed of its own, which a replay's never is: only
        // forks of a template (`zygote`) share one, so only they are worth a try.
        let hashes = cmd.language != sandcall_api::Language::Python || inner.config.languages.zygote;
        let warm = if cmd.custom_limits || !hashes {
            None
        } else {
            tier.take_warm(&session.principal, cmd.language, &spec.code).await
        };
        let warm = match warm {
            Some(helper) if helper.hash_seed().is_none_or(|s| s == journal.start.hash_seed) => Some(helper),
            Some(other) => {
                // Another template's seed (rebuilt since, as after a restart): a set could
                // iterate in another order. Given back, and the replay runs cold.
                other.discard();
                None
            }
            None => None,
        };
        if let Some(helper) = &warm {
            spec.run_id = helper.run_id().to_owned();
        }
        let outbox = inner.outbox_dir.join(&spec.run_id);
        spec.collect = Some(crate::files::ops::collect_into(
            &inner.config,
            &outbox,
            spec.limits.workspace_bytes,
        ));
        let started = match warm {
            Some(helper) => {
                let names = cmd.tools.names();
                let (go, files) = crate::runtime::warm_go(cmd.language, &cmd.args, Some(&names));
                spec.go = Some(go);
                spec.support_files = files;
                seed_run(&mut spec, cmd.language, journal.start.seed, None);
                helper.begin(spec).await
            }
            None => {
                seed_run(
                    &mut spec,
                    cmd.language,
                    journal.start.seed,
                    Some(journal.start.hash_seed),
                );
                tier.start(spec).await
            }
        };
        let helper = started.map_err(|e| {
            tier.record_failure(&e);
            e.to_string()
        })?;
        let loop_deadline = journal
            .start
            .loop_deadline_ms
            .map(|at| Instant::now() + Duration::from_millis(at.saturating_sub(now_ms())));
        let driver = DriverSpec {
            sessions: self.clone(),
            session: session.clone(),
            tools: cmd.tools,
            max_tool_calls: cmd.max_tool_calls,
            language: cmd.language,
            outbox,
            tier,
            loop_deadline,
            replay: Some(replay),
            state,
            staged,
            held,
            endpoint: None,
        };
        Ok((driver, helper))
    }
}

/// `text` without its first `*skip` bytes (the output the caller already has), cut at a
/// character boundary; `*skip` goes down by what was cut.
pub(super) fn skip_sent(text: &str, skip: &mut u64) -> String {
    let mut cut = (*skip).min(text.len() as u64) as usize;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    *skip -= (cut as u64).min(*skip);
    text[cut..].to_owned()
}

/// Why a session granted network is not brought back after a restart or an eviction.
pub(super) const NOT_REPLAYED_WITH_NETWORK: &str =
    "it was granted network, and a replay would repeat its network requests (docs/egress.md, \"Replay\"); start it again";
