//! A session's state as requests see it: its phase, the response published for it, the
//! last resume (so that a retried resume is answered again, not run twice) and the
//! digest of a resume's results.

use super::*;

/// Where a session is.
pub(super) enum Phase {
    Running,
    /// Waiting for the caller: the calls handed out at pause number `pause`.
    Paused {
        pause: u64,
        calls: Vec<(String, u64)>,
    },
    /// Out of its pause because the loop's time ran out, until the sandbox has stopped
    /// and the ending is published: a resume that comes now waits for the ending and
    /// answers it, as a resume of an ended session does.
    Ending,
    /// Its pause outlived `session_expiry`: gone for every request from this moment,
    /// though the registry and the sandbox let go of it a little later.
    Expired,
    Done,
}

pub(super) struct Shared {
    pub(super) phase: Phase,
    /// What GET answers now; also what a waiting request receives.
    pub(super) response: Published,
    /// The last resume accepted, so that a retry of it (same token, same results)
    /// answers what it answered. One per session: only the latest token can be retried.
    pub(super) last_resume: Option<LastResume>,
    /// The session is paused with no sandbox (evicted, or journalled by a server before
    /// a restart): since when it has been paused, ms since the epoch. A resume brings it
    /// back by replay (`Sessions::revive`).
    pub(super) dormant: Option<u64>,
}

/// An accepted resume: the pause it answered, a digest of its results, and its answer
/// once published (the next pause or the end). The answer shares the published
/// response's arguments, so keeping it costs no copy of them.
pub(super) struct LastResume {
    pub(super) pause: u64,
    pub(super) digest: [u8; 32],
    /// The answer, and the version it was published as: while it is still the current
    /// response, a retry answers the current response's JSON (serialized once).
    pub(super) answer: Option<(u64, Published)>,
}

/// A response as published, and its JSON once a GET asked for it: every later GET
/// answers those same bytes, so no GET serializes (or copies) the pending calls again.
/// Cloning the response itself copies no arguments either (`ToolArguments` is shared).
pub(super) struct Published {
    pub(super) response: ProgrammaticResponse,
    pub(super) json: Option<Bytes>,
}

impl From<ProgrammaticResponse> for Published {
    fn from(response: ProgrammaticResponse) -> Published {
        Published { response, json: None }
    }
}

impl Published {
    /// A copy: the response shares its arguments, the JSON its bytes.
    pub(super) fn copy(&self) -> Published {
        Published {
            response: self.response.clone(),
            json: self.json.clone(),
        }
    }
}

impl LastResume {
    pub(super) fn copy(&self) -> LastResume {
        LastResume {
            pause: self.pause,
            digest: self.digest,
            answer: self.answer.as_ref().map(|(v, p)| (*v, p.copy())),
        }
    }
}

/// What a resume does next.
pub(super) enum Step {
    /// Hand these replies to the program.
    Go(Vec<(u64, ToolReply)>),
    /// Wait past this version, then look again.
    Wait(u64),
    /// Answer the dormant session's pause, from the store.
    Stored,
}

/// What a use of a token whose pause is no longer open gets.
pub(super) enum Again {
    /// The answer: the first use's, for a retry, or the session's ending.
    Answer(Result<Bytes, EngineError>),
    /// The retried resume has no answer yet: wait for the next version and look again.
    Wait,
    /// 409.
    Used,
    /// 404: the session expired.
    Gone,
    /// The answer is the pause of a dormant session, kept only in the store.
    Stored,
}

pub(super) fn answer_again(shared: &mut Shared, version: u64, pause: u64, digest: &[u8; 32]) -> Again {
    if let Some(last) = shared.last_resume.as_mut().filter(|l| l.pause == pause) {
        if last.digest != *digest {
            return Again::Used;
        }
        // A dormant session paused after its last resume: that pause is the answer.
        if shared.dormant.is_some() {
            return Again::Stored;
        }
        return match last.answer.as_mut() {
            // Still the current response: its JSON is the one every request shares.
            Some((at, _)) if *at == version => Again::Answer(published_json(&mut shared.response)),
            Some((_, answer)) => Again::Answer(published_json(answer)),
            // The first use is still on its way to the program; its answer comes
            // with the next published version.
            None => Again::Wait,
        };
    }
    match shared.phase {
        Phase::Done => Again::Answer(published_json(&mut shared.response)),
        // The ending is on its way.
        Phase::Ending => Again::Wait,
        Phase::Expired => Again::Gone,
        Phase::Running | Phase::Paused { .. } => Again::Used,
    }
}

/// A published response's JSON, serialized at most once.
pub(super) fn published_json(published: &mut Published) -> Result<Bytes, EngineError> {
    if let Some(json) = &published.json {
        return Ok(json.clone());
    }
    let json = Bytes::from(serde_json::to_vec(&published.response).map_err(serialize_failed)?);
    published.json = Some(json.clone());
    Ok(json)
}

/// A digest of a resume's results, the same whatever their order: a retry is told
/// from a different answer by it.
pub(super) fn results_digest(results: &[ToolResult]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut sorted: Vec<&ToolResult> = results.iter().collect();
    sorted.sort_by(|a, b| a.call_id.cmp(&b.call_id));
    let mut hash = Sha256::new();
    for r in sorted {
        for part in [
            r.call_id.as_str(),
            if r.is_error { "1" } else { "0" },
            r.error_message.as_deref().unwrap_or(""),
            r.result.get(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
    }
    hash.finalize().into()
}

/// Each result's JSON text must fit `max_tool_result_bytes` (413, the token stays good).
pub(super) fn check_result_sizes(results: &[ToolResult], max: u64) -> Result<(), EngineError> {
    for r in results {
        let size = r.result.get().len() as u64 + r.error_message.as_ref().map_or(0, |m| m.len() as u64);
        if size > max {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                error_type::PAYLOAD_TOO_LARGE,
                format!(
                    "the result for call_id {:?} is {size} bytes, over the limit of {max} (max_tool_result_bytes)",
                    r.call_id
                ),
            ));
        }
    }
    Ok(())
}

/// The results answer some or all of the pending calls: each at most once, none
/// unknown, at least one.
pub(super) fn match_results(
    calls: &[(String, u64)],
    results: &[ToolResult],
) -> Result<Vec<(u64, ToolReply)>, EngineError> {
    let bad = |m: String| EngineError::new(ErrorKind::Invalid, error_type::INVALID_TOOL_RESULTS, m);
    let mut replies = Vec::with_capacity(calls.len());
    let mut seen = std::collections::HashSet::new();
    for r in results {
        let Some((_, key)) = calls.iter().find(|(id, _)| *id == r.call_id) else {
            return Err(bad(format!(
                "call_id {:?} is not a pending call of this session",
                r.call_id
            )));
        };
        if !seen.insert(r.call_id.as_str()) {
            return Err(bad(format!("call_id {:?} is answered twice", r.call_id)));
        }
        let reply = if r.is_error {
            ToolReply::error(
                "tool_error",
                r.error_message.clone().unwrap_or_else(|| "the tool failed".into()),
            )
        } else {
            ToolReply::result(r.result.clone())
        };
        replies.push((*key, reply));
    }
    if replies.is_empty() {
        let pending: Vec<&str> = calls.iter().map(|(id, _)| id.as_str()).collect();
        return Err(bad(format!(
            "tool_results is empty: answer one or more of the pending calls {}",
            pending.join(", ")
        )));
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, value: Value) -> ToolResult {
        ToolResult {
            call_id: id.into(),
            result: serde_json::value::to_raw_value(&value).unwrap(),
            is_error: false,
            error_message: None,
        }
    }

    #[test]
    fn results_answer_some_or_all_of_the_pending_calls() {
        let calls = vec![("a".to_string(), 1), ("b".to_string(), 2)];
        let ok = match_results(&calls, &[result("b", Value::from(2)), result("a", Value::from(1))]).unwrap();
        assert_eq!(ok.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![2, 1]);
        // Some of them: the rest wait for the next pause.
        let some = match_results(&calls, &[result("b", Value::Null)]).unwrap();
        assert_eq!(some.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![2]);
        for bad in [
            vec![
                result("a", Value::Null),
                result("b", Value::Null),
                result("c", Value::Null),
            ],
            vec![result("a", Value::Null), result("a", Value::Null)],
            vec![],
        ] {
            assert_eq!(
                match_results(&calls, &bad).unwrap_err().error_type,
                "invalid_tool_results"
            );
        }
    }

    #[test]
    fn a_retry_is_told_by_its_results_whatever_their_order() {
        let one = [result("a", Value::from(1)), result("b", Value::from("x"))];
        let same = [result("b", Value::from("x")), result("a", Value::from(1))];
        let other = [result("a", Value::from(2)), result("b", Value::from("x"))];
        assert_eq!(results_digest(&one), results_digest(&same));
        assert_ne!(results_digest(&one), results_digest(&other));
        let mut failed = result("a", Value::from(1));
        failed.is_error = true;
        assert_ne!(results_digest(&one[..1]), results_digest(&[failed]));
    }

    #[test]
    fn results_over_max_tool_result_bytes_are_refused() {
        let big = result("a", Value::from("x".repeat(100)));
        assert!(check_result_sizes(std::slice::from_ref(&big), 102).is_ok());
        let err = check_result_sizes(&[big], 101).unwrap_err();
        assert_eq!(err.kind, ErrorKind::TooLarge);
        assert!(err.message.contains("max_tool_result_bytes"), "{}", err.message);
    }

    #[test]
    fn errors_become_tool_errors() {
        let calls = vec![("a".to_string(), 7)];
        let r = ToolResult {
            call_id: "a".into(),
            result: Default::default(),
            is_error: true,
            error_message: Some("boom".into()),
        };
        let replies = match_results(&calls, &[r]).unwrap();
        assert_eq!(replies[0].1, ToolReply::error("tool_error", "boom"));
    }
}
