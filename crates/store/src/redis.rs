//! The Redis session store (`session_store = "redis://host:port/db"`): the journals of
//! programmatic sessions, shared by every node of a cluster, and the leases by which one
//! node at a time owns a session live.
//!
//! A session `S` is six keys, all with the hash tag `{S}` (so a Redis Cluster keeps them
//! in one slot, which scripts need):
//!
//! | key | value |
//! | --- | --- |
//! | `sandcall:s:{S}:start` | the `SessionStart`, as JSON (written once) |
//! | `sandcall:s:{S}:principal` | the principal (written once) |
//! | `sandcall:s:{S}:state` | the `SessionState`, as JSON (replaced by each write) |
//! | `sandcall:s:{S}:token` | `"<pause>:<open 0/1>"`: what `consume` compares |
//! | `sandcall:s:{S}:entries` | the journal entries, a list of JSON texts |
//! | `sandcall:s:{S}:owner` | the owning node's id, with the lease as its expiry (PX) |
//! | `sandcall:s:{S}:dormant` | while the session is dormant: its `Dormancy`, as JSON |
//! | `sandcall:s:{S}:request` | the name of the request-id key that names the session |
//!
//! and three kinds of keys shared by all sessions: `sandcall:dormant:due`, a sorted set
//! of the dormant sessions' ids by deadline (`due`); `sandcall:dormant:count`, a hash of
//! each principal's dormant sessions; and `sandcall:req:<principal>\0<request id>`, the
//! session a request id names (one per session). The scripts that keep them touch keys
//! of more than one slot: they need one Redis (or a Redis Cluster with every key of
//! sandcall on one shard), as the Redis of a sandcall cluster is.
//!
//! Every operation is one atomic step: a MULTI/EXEC pipeline or a Lua script, which Redis
//! runs whole with nothing in between. `consume` compares the token key and writes in one
//! script, so that of two nodes that use one token at once exactly one succeeds; `claim`
//! sets the owner only if no other owner's lease is still good. Each write also sets the
//! session's keys to expire (`ttl`), so a session no node ends does not stay forever.
//!
//! Must not: know HTTP or the session state machine (`programmatic::session` decides
//! what to write).

use super::{Dormancy, Journal, JournalEntry, SessionStart, SessionState, SessionStore, StoreError};
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// Appends entries and replaces the state: only if the session exists, and, when
/// ARGV[4] is not empty, only if the token key equals it (`consume`).
/// KEYS: token, state, entries, start, principal. ARGV: new token, state JSON, ttl ms,
/// expected token or "", entries...
const WRITE_STEP: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if ARGV[4] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[4] then return 0 end
for i = 5, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
return 1
"#;

/// Makes ARGV[1] the owner for ARGV[2] ms unless another owner's lease is still good.
const CLAIM: &str = r#"
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#;

/// Deletes the owner key if ARGV[1] holds it.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#;

/// Lets KEYS[b] (a request-id key) name session ARGV[id] in place of the one KEYS[a] (the
/// session's `request` key) names now; ARGV[ttl] ms. Spliced into the scripts below.
fn name_snippet(a: usize, b: usize, id: usize, ttl: usize) -> String {
    format!(
        "local prev = redis.call('GET', KEYS[{a}])\n\
         if prev and prev ~= KEYS[{b}] and redis.call('GET', prev) == ARGV[{id}] then redis.call('DEL', prev) end\n\
         redis.call('SET', KEYS[{b}], ARGV[{id}], 'PX', ARGV[{ttl}])\n\
         redis.call('SET', KEYS[{a}], KEYS[{b}], 'PX', ARGV[{ttl}])\n"
    )
}

/// Takes a dormant session out of the index (even if its record expired) and its
/// principal's count.
/// KEYS[d]: dormant, due, count; ARGV[id]. Leaves `d` (the record) in a local.
fn wake_snippet(k: usize, id: usize) -> String {
    let (dormant, due, count) = (k, k + 1, k + 2);
    format!(
        "local old = redis.call('GET', KEYS[{dormant}])\n\
         local d = nil\n\
         redis.call('ZREM', KEYS[{due}], ARGV[{id}])\n\
         if old then\n\
           d = cjson.decode(old)\n\
           redis.call('DEL', KEYS[{dormant}])\n\
           if redis.call('HINCRBY', KEYS[{count}], d.principal, -1) <= 0 then redis.call('HDEL', KEYS[{count}], d.principal) end\n\
         end\n"
    )
}

/// `sleep`. KEYS: state, dormant, due, count, request, new request key (or the
/// `request` key again when there is none). ARGV: principal, due ms, record JSON, id,
/// ttl ms, "1" when there is a request id.
fn sleep_script() -> String {
    format!(
        "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n{}\
         redis.call('HINCRBY', KEYS[4], ARGV[1], 1)\n\
         redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])\n\
         redis.call('ZADD', KEYS[3], ARGV[2], ARGV[4])\n\
         if ARGV[6] == '1' then\n{}end\n\
         return 1\n",
        wake_snippet(2, 4),
        name_snippet(5, 6, 4, 5)
    )
}

/// `wake`. KEYS: dormant, due, count. ARGV: id. Answers the audit trail, or nil.
fn wake_script() -> String {
    format!("{}if d then return d.audit end\nreturn false\n", wake_snippet(1, 1))
}

/// `name_request`. KEYS: state, request, new request key. ARGV: id, ttl ms.
fn name_script() -> String {
    format!(
        "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n{}return 1\n",
        name_snippet(2, 3, 1, 2)
    )
}

/// `remove`. KEYS: dormant, due, count, request, then the journal's keys. ARGV: id.
fn remove_script() -> String {
    format!(
        "{}local prev = redis.call('GET', KEYS[4])\n\
         if prev and redis.call('GET', prev) == ARGV[1] then redis.call('DEL', prev) end\n\
         for i = 4, #KEYS do redis.call('DEL', KEYS[i]) end\n\
         return 1\n",
        wake_snippet(1, 1)
    )
}

const DUE_KEY: &str = "sandcall:dormant:due";
const COUNT_KEY: &str = "sandcall:dormant:count";

fn request_key(principal: &str, request_id: &str) -> String {
    format!("sandcall:req:{principal}\0{request_id}")
}

/// How long one command may take before the store counts as unavailable.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

pub struct RedisSessionStore {
    conn: ConnectionManager,
    /// How long a session's keys live after its last write, in ms.
    ttl_ms: u64,
    write_step: redis::Script,
    claim: redis::Script,
    release: redis::Script,
    sleep: redis::Script,
    wake: redis::Script,
    name: redis::Script,
    remove: redis::Script,
}

/// Every error of the Redis client means Redis could not do it now (down, restarting,
/// loading its data, too slow): the caller answers 503 and nothing was written, since
/// each operation is one atomic step.
fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(StoreError::Codec)
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(StoreError::BadRecord)
}

fn key(id: &str, part: &str) -> String {
    format!("sandcall:s:{{{id}}}:{part}")
}

fn token_of(state: &SessionState) -> String {
    format!("{}:{}", state.pause, u8::from(state.open))
}

impl RedisSessionStore {
    /// A store on the Redis at `url` (`redis://host:port/db`). It connects lazily: a
    /// server starts while Redis is down, and answers 503 until it is up.
    pub fn open(url: &str, ttl_ms: u64) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError::SessionStoreUrl(Box::new(e)))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            // While Redis is down, a request fails after one quick reconnection attempt
            // (503) instead of waiting through a long backoff.
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(unavailable)?;
        Ok(RedisSessionStore {
            conn,
            ttl_ms: ttl_ms.max(1),
            write_step: redis::Script::new(WRITE_STEP),
            claim: redis::Script::new(CLAIM),
            release: redis::Script::new(RELEASE),
            sleep: redis::Script::new(&sleep_script()),
            wake: redis::Script::new(&wake_script()),
            name: redis::Script::new(&name_script()),
            remove: redis::Script::new(&remove_script()),
        })
    }

    /// Runs the write script: 1 written, 0 the token did not match, -1 no such session.
    async fn write(
        &self,
        id: &str,
        expected: &str,
        entries: &[JournalEntry],
        state: &SessionState,
    ) -> Result<i64, StoreError> {
        let mut invocation = self.write_step.prepare_invoke();
        for part in ["token", "state", "entries", "start", "principal"] {
            invocation.key(key(id, part));
        }
        invocation
            .arg(token_of(state))
            .arg(json(state)?)
            .arg(self.ttl_ms)
            .arg(expected);
        for entry in entries {
            invocation.arg(json(entry)?);
        }
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }
}

#[async_trait]
impl SessionStore for RedisSessionStore {
    async fn create(&self, id: &str, start: &SessionStart, state: &SessionState) -> Result<(), StoreError> {
        let ttl = self.ttl_ms;
        redis::pipe()
            .atomic()
            .del(key(id, "entries"))
            .ignore()
            .pset_ex(key(id, "start"), json(start)?, ttl)
            .ignore()
            .pset_ex(key(id, "principal"), &start.principal, ttl)
            .ignore()
            .pset_ex(key(id, "state"), json(state)?, ttl)
            .ignore()
            .pset_ex(key(id, "token"), token_of(state), ttl)
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn append(&self, id: &str, entries: &[JournalEntry], state: &SessionState) -> Result<(), StoreError> {
        // A pause follows the previous one's resume (or the start): the stored token is
        // the previous pause, closed. Another node that ran the same session on (after a
        // Redis outage longer than a lease) cannot journal a pause over this one's.
        let expected = match state.pause {
            0 => String::new(),
            n => format!("{}:0", n - 1),
        };
        match self.write(id, &expected, entries, state).await? {
            1 => Ok(()),
            0 => Err(StoreError::Moved(id.to_owned())),
            _ => Err(StoreError::NotJournalled(id.to_owned())),
        }
    }

    async fn consume(
        &self,
        id: &str,
        pause: u64,
        entries: &[JournalEntry],
        state: &SessionState,
    ) -> Result<bool, StoreError> {
        Ok(self.write(id, &format!("{pause}:1"), entries, state).await? == 1)
    }

    async fn load(&self, id: &str) -> Result<Option<Journal>, StoreError> {
        // One MULTI: the start, the state and the entries of the same moment.
        let (start, state, entries): (Option<String>, Option<String>, Vec<String>) = redis::pipe()
            .atomic()
            .get(key(id, "start"))
            .get(key(id, "state"))
            .lrange(key(id, "entries"), 0, -1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let (Some(start), Some(state)) = (start, state) else {
            return Ok(None);
        };
        Ok(Some(Journal {
            start: parse(&start)?,
            state: parse(&state)?,
            entries: entries.iter().map(|e| parse(e)).collect::<Result<_, _>>()?,
        }))
    }

    async fn state(&self, id: &str) -> Result<Option<SessionState>, StoreError> {
        let state: Option<String> = redis::cmd("GET")
            .arg(key(id, "state"))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        state.map(|s| parse(&s)).transpose()
    }

    async fn list(&self) -> Result<Vec<(String, String, SessionState)>, StoreError> {
        let mut conn = self.conn.clone();
        let mut ids = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("sandcall:s:{*}:state")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            ids.extend(keys.iter().filter_map(|k| {
                let inner = k.strip_prefix("sandcall:s:{")?.strip_suffix("}:state")?;
                Some(inner.to_owned())
            }));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut all = Vec::with_capacity(ids.len());
        for id in ids {
            // An unreadable or half-expired record is left out: it cannot be brought back.
            if let Ok(Some((principal, state))) = self.entry(&id).await {
                all.push((id, principal, state));
            }
        }
        Ok(all)
    }

    async fn remove(&self, id: &str) -> Result<(), StoreError> {
        // The owner key stays until its lease runs out: a session that ended stays
        // readable on its node for a while, and the other nodes still send requests there.
        // With what it kept while dormant, and its request id, in one script.
        let mut invocation = self.remove.prepare_invoke();
        invocation
            .key(key(id, "dormant"))
            .key(DUE_KEY)
            .key(COUNT_KEY)
            .key(key(id, "request"));
        for part in ["start", "principal", "state", "token", "entries"] {
            invocation.key(key(id, part));
        }
        invocation
            .arg(id)
            .invoke_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn claim(&self, id: &str, owner: &str, now_ms: u64, until_ms: u64) -> Result<bool, StoreError> {
        // Redis counts the lease on its own clock: only its length is sent.
        let lease_ms = until_ms.saturating_sub(now_ms).max(1);
        let claimed: i64 = self
            .claim
            .key(key(id, "owner"))
            .arg(owner)
            .arg(lease_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(claimed == 1)
    }

    async fn entry(&self, id: &str) -> Result<Option<(String, SessionState)>, StoreError> {
        let (principal, state): (Option<String>, Option<String>) = redis::pipe()
            .atomic()
            .get(key(id, "principal"))
            .get(key(id, "state"))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        match (principal, state) {
            (Some(principal), Some(state)) => Ok(Some((principal, parse(&state)?))),
            _ => Ok(None),
        }
    }

    async fn owner(&self, id: &str, _now_ms: u64) -> Result<Option<String>, StoreError> {
        // The key expires with the lease (PX), on Redis's clock.
        redis::cmd("GET")
            .arg(key(id, "owner"))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        self.release
            .key(key(id, "owner"))
            .arg(owner)
            .invoke_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    fn shared(&self) -> bool {
        true
    }

    async fn sleep(&self, id: &str, dormancy: &Dormancy) -> Result<bool, StoreError> {
        let mut invocation = self.sleep.prepare_invoke();
        invocation
            .key(key(id, "state"))
            .key(key(id, "dormant"))
            .key(DUE_KEY)
            .key(COUNT_KEY)
            .key(key(id, "request"));
        match &dormancy.request_id {
            Some(r) => invocation.key(request_key(&dormancy.principal, r)),
            None => invocation.key(key(id, "request")),
        };
        let written: i64 = invocation
            .arg(&dormancy.principal)
            .arg(dormancy.due_ms)
            .arg(json(dormancy)?)
            .arg(id)
            .arg(self.ttl_ms)
            .arg(if dormancy.request_id.is_some() { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(written == 1)
    }

    async fn wake(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.wake
            .key(key(id, "dormant"))
            .key(DUE_KEY)
            .key(COUNT_KEY)
            .arg(id)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        redis::cmd("ZRANGEBYSCORE")
            .arg(DUE_KEY)
            .arg("-inf")
            .arg(now_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn dormant(&self, principal: Option<&str>) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let n: Option<u64> = match principal {
            Some(p) => redis::cmd("HGET").arg(COUNT_KEY).arg(p).query_async(&mut conn).await,
            None => redis::cmd("ZCARD").arg(DUE_KEY).query_async(&mut conn).await,
        }
        .map_err(unavailable)?;
        Ok(n.unwrap_or(0))
    }

    async fn dormant_audit(&self, id: &str) -> Result<Option<String>, StoreError> {
        let record: Option<String> = redis::cmd("GET")
            .arg(key(id, "dormant"))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(record.map(|r| parse::<Dormancy>(&r)).transpose()?.map(|d| d.audit))
    }

    async fn name_request(&self, principal: &str, request_id: &str, id: &str) -> Result<(), StoreError> {
        self.name
            .key(key(id, "state"))
            .key(key(id, "request"))
            .key(request_key(principal, request_id))
            .arg(id)
            .arg(self.ttl_ms)
            .invoke_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn by_request(&self, principal: &str, request_id: &str) -> Result<Option<String>, StoreError> {
        redis::cmd("GET")
            .arg(request_key(principal, request_id))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    //! Against the real Redis of `SANDCALL_TEST_REDIS_URL` (`.ci/run` starts one).
    use super::*;

    fn redis_url() -> String {
        std::env::var("SANDCALL_TEST_REDIS_URL").expect(
            "SANDCALL_TEST_REDIS_URL is not set: these tests need a real Redis (`.ci/run` starts one; \
             locally: redis-server --port 6390, then SANDCALL_TEST_REDIS_URL=redis://127.0.0.1:6390/0)",
        )
    }

    fn start() -> SessionStart {
        SessionStart {
            principal: "p".into(),
            request: serde_json::from_value(serde_json::json!({"code": "print(1)", "language": "py"})).unwrap(),
            seed: 7,
            hash_seed: 8,
            loop_deadline_ms: None,
            created_ms: 1,
            workspace: None,
        }
    }

    fn call(id: &str) -> JournalEntry {
        JournalEntry::Call {
            pause: 1,
            call_id: id.into(),
            name: "t".into(),
            arguments: serde_json::value::RawValue::from_string(r#"{"x":1}"#.into()).unwrap(),
        }
    }

    fn reply(id: &str) -> JournalEntry {
        JournalEntry::Reply {
            call_id: id.into(),
            reply: sandcall_sandbox::protocol::ToolReply::error("tool_error", "no"),
        }
    }

    #[tokio::test]
    async fn a_journal_in_redis_keeps_its_steps_and_a_token_is_consumed_once() {
        let store = RedisSessionStore::open(&redis_url(), 60_000).unwrap();
        let id = format!("unit-{}", sandcall_api::ids::new_id());
        store.create(&id, &start(), &SessionState::default()).await.unwrap();
        let paused = SessionState {
            pause: 1,
            open: true,
            outstanding: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        store.append(&id, &[call("a"), call("b")], &paused).await.unwrap();
        let answered = SessionState {
            open: false,
            outstanding: vec![],
            ..paused.clone()
        };
        assert!(!store.consume(&id, 2, &[reply("a")], &answered).await.unwrap());
        assert!(store.consume(&id, 1, &[reply("a")], &answered).await.unwrap());
        assert!(!store.consume(&id, 1, &[reply("a")], &answered).await.unwrap());
        // A pause must follow the state it moves on from: pause 2 after pause 1's resume,
        // not pause 3, and not pause 2 twice.
        let skipped = SessionState {
            pause: 3,
            open: true,
            ..Default::default()
        };
        assert!(store.append(&id, &[call("c")], &skipped).await.is_err());
        let journal = store.load(&id).await.unwrap().unwrap();
        assert_eq!(journal.state, answered);
        assert_eq!(journal.start.seed, 7);
        assert_eq!(journal.entries.len(), 3);
        assert!(matches!(&journal.entries[2], JournalEntry::Reply { call_id, .. } if call_id == "a"));
        assert_eq!(
            store.entry(&id).await.unwrap(),
            Some(("p".to_string(), answered.clone()))
        );
        assert!(store.list().await.unwrap().iter().any(|(i, p, _)| *i == id && p == "p"));
        // Leases: another owner waits until the lease runs out; a release ends it.
        assert!(store.claim(&id, "n1", 0, 60_000).await.unwrap());
        assert!(!store.claim(&id, "n2", 0, 60_000).await.unwrap());
        assert!(store.claim(&id, "n1", 0, 60_000).await.unwrap());
        assert_eq!(store.owner(&id, 0).await.unwrap().as_deref(), Some("n1"));
        store.release(&id, "n2").await.unwrap();
        assert_eq!(store.owner(&id, 0).await.unwrap().as_deref(), Some("n1"));
        store.release(&id, "n1").await.unwrap();
        assert!(store.claim(&id, "n2", 0, 100).await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(store.owner(&id, 0).await.unwrap(), None);
        assert!(store.claim(&id, "n1", 0, 60_000).await.unwrap());
        store.remove(&id).await.unwrap();
        store.release(&id, "n1").await.unwrap();
        assert!(store.load(&id).await.unwrap().is_none());
        assert!(store.entry(&id).await.unwrap().is_none());
        // Writing to a session that is not there writes nothing.
        assert!(store.append(&id, &[call("a")], &paused).await.is_err());
        assert!(!store.consume(&id, 1, &[reply("a")], &answered).await.unwrap());
        assert!(store.load(&id).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn of_many_concurrent_consumes_of_one_token_exactly_one_succeeds() {
        let url = redis_url();
        let id = format!("race-{}", sandcall_api::ids::new_id());
        let paused = SessionState {
            pause: 1,
            open: true,
            ..Default::default()
        };
        {
            let store = RedisSessionStore::open(&url, 60_000).unwrap();
            store.create(&id, &start(), &SessionState::default()).await.unwrap();
            store.append(&id, &[call("a")], &paused).await.unwrap();
        }
        // Each contender has its own connection, as separate nodes would.
        let mut tasks = Vec::new();
        for n in 0..32 {
            let (url, id) = (url.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                let store = RedisSessionStore::open(&url, 60_000).unwrap();
                let answered = SessionState {
                    pause: 1,
                    open: false,
                    calls_made: n,
                    ..Default::default()
                };
                store.consume(&id, 1, &[reply("a")], &answered).await.unwrap()
            }));
        }
        let mut won = 0;
        for t in tasks {
            won += usize::from(t.await.unwrap());
        }
        assert_eq!(won, 1, "exactly one consume of one token succeeds");
        let store = RedisSessionStore::open(&url, 60_000).unwrap();
        let journal = store.load(&id).await.unwrap().unwrap();
        assert_eq!(journal.entries.len(), 2, "one reply was journalled, once");
        store.remove(&id).await.unwrap();
    }

    #[tokio::test]
    async fn dormant_sessions_are_indexed_counted_and_named_in_redis() {
        let store = RedisSessionStore::open(&redis_url(), 60_000).unwrap();
        let id = format!("dormant-{}", sandcall_api::ids::new_id());
        super::super::check_dormancy(&store, &id, &format!("p-{id}")).await;
    }

    #[tokio::test]
    async fn a_redis_that_is_down_is_unavailable_not_an_error_of_the_session() {
        // Nothing listens on port 1.
        let store = RedisSessionStore::open("redis://127.0.0.1:1/0", 60_000).unwrap();
        let err = store.state("x").await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }
}
