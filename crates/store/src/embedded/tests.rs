use super::super::QuotaExceeded;
use super::*;
use crate::now_ms;

const ROOMY: Quota = Quota {
    max_bytes: 1 << 30,
    max_files: 1000,
};

fn meta(principal: &str, session: &str, id: &str, expires_ms: u64) -> FileMeta {
    FileMeta {
        principal: principal.into(),
        session_id: session.into(),
        id: id.into(),
        name: format!("{id}.txt"),
        size: 5,
        content_type: "text/plain".into(),
        sha256: String::new(),
        created_ms: 1,
        expires_ms,
        kind: None,
        entity_id: None,
        version: None,
        read_only: false,
    }
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandcall-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Inserts a file of 5 bytes.
async fn put(store: &LocalStore, m: FileMeta, quota: Quota) -> Result<(), StoreError> {
    let temp = store.incoming_dir().join(&m.id);
    std::fs::write(&temp, b"hello").unwrap();
    store.insert(m, &temp, quota).await
}

async fn usage(store: &LocalStore, principal: &str) -> (u64, u64) {
    let u = store.usage(principal).await.unwrap();
    (u.bytes, u.files)
}

#[tokio::test]
async fn files_are_per_principal_and_swept_when_due() {
    let dir = test_dir("sweep");
    let store = LocalStore::open(&dir).unwrap();
    let far = now_ms() + 3_600_000;
    for (p, id, exp) in [("alice", "f1", far), ("alice", "f2", 10), ("bob", "f3", far)] {
        put(&store, meta(p, "s1", id, exp), ROOMY).await.unwrap();
    }
    let names = |v: Vec<FileMeta>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(
        names(store.list("alice", "s1").await.unwrap()),
        vec!["f1"],
        "expired f2 is hidden"
    );
    assert_eq!(names(store.list("bob", "s1").await.unwrap()), vec!["f3"]);
    assert!(
        store.get("bob", "s1", "f1").await.unwrap().is_none(),
        "another principal's file"
    );
    assert_eq!(store.sweep(now_ms()).await.unwrap(), 1);
    assert!(!store.object_path("s1", "f2").exists());
    assert!(store.delete("alice", "s1", "f1").await.unwrap());
    assert!(!store.delete("alice", "s1", "f1").await.unwrap());
    assert!(store.object_path("s1", "f3").exists());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn usage_follows_inserts_deletes_and_sweeps_and_survives_a_reopen() {
    let dir = test_dir("usage");
    let store = LocalStore::open(&dir).unwrap();
    let far = now_ms() + 3_600_000;
    put(&store, meta("alice", "s1", "f1", far), ROOMY).await.unwrap();
    put(&store, meta("alice", "s1", "f2", 10), ROOMY).await.unwrap();
    put(&store, meta("bob", "s2", "f3", far), ROOMY).await.unwrap();
    assert_eq!(usage(&store, "alice").await, (10, 2));
    assert_eq!(usage(&store, "bob").await, (5, 1));
    assert_eq!(usage(&store, "carol").await, (0, 0));

    // Over either quota: refused with which one, nothing recorded or moved.
    let bytes = Quota {
        max_bytes: 14,
        max_files: 1000,
    };
    let err = put(&store, meta("alice", "s1", "f4", far), bytes).await.unwrap_err();
    assert!(matches!(err, StoreError::Quota(QuotaExceeded::Bytes(14))), "{err}");
    let files = Quota {
        max_bytes: 1 << 30,
        max_files: 2,
    };
    let err = put(&store, meta("alice", "s1", "f4", far), files).await.unwrap_err();
    assert!(matches!(err, StoreError::Quota(QuotaExceeded::Files(2))), "{err}");
    assert_eq!(usage(&store, "alice").await, (10, 2));
    assert!(store.get("alice", "s1", "f4").await.unwrap().is_none());
    assert!(!store.object_path("s1", "f4").exists());
    // Exactly at the quota is within it.
    let exact = Quota {
        max_bytes: 15,
        max_files: 3,
    };
    put(&store, meta("alice", "s1", "f4", far), exact).await.unwrap();
    assert_eq!(usage(&store, "alice").await, (15, 3));

    // A delete frees the file's share once; a sweep of an expired file frees it too.
    assert!(store.delete("alice", "s1", "f1").await.unwrap());
    assert!(!store.delete("alice", "s1", "f1").await.unwrap());
    assert_eq!(usage(&store, "alice").await, (10, 2));
    assert_eq!(store.sweep(now_ms()).await.unwrap(), 1);
    assert_eq!(usage(&store, "alice").await, (5, 1));
    assert_eq!(usage(&store, "bob").await, (5, 1));

    // Kept in the database: the same after a reopen.
    drop(store);
    let store = LocalStore::open(&dir).unwrap();
    assert_eq!(usage(&store, "alice").await, (5, 1));
    assert_eq!(usage(&store, "bob").await, (5, 1));
    assert!(store.delete("alice", "s1", "f4").await.unwrap());
    assert_eq!(usage(&store, "alice").await, (0, 0));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_data_dir_from_before_quotas_has_its_usage_counted_at_open() {
    let dir = test_dir("legacy");
    let store = LocalStore::open(&dir).unwrap();
    let far = now_ms() + 3_600_000;
    for (p, id) in [("alice", "f1"), ("alice", "f2"), ("bob", "f3")] {
        put(&store, meta(p, "s1", id, far), ROOMY).await.unwrap();
    }
    drop(store);
    // What an older server left: the files and expiry tables, no usage table.
    let db = Database::create(dir.join("files/meta.redb")).unwrap();
    let tx = db.begin_write().unwrap();
    assert!(tx.delete_table(USAGE).unwrap());
    tx.commit().unwrap();
    drop(db);
    let store = LocalStore::open(&dir).unwrap();
    assert_eq!(usage(&store, "alice").await, (10, 2));
    assert_eq!(usage(&store, "bob").await, (5, 1));
    assert!(store.delete("bob", "s1", "f3").await.unwrap());
    assert_eq!(usage(&store, "bob").await, (0, 0));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_inserts_never_pass_the_quota_together() {
    let dir = test_dir("race");
    let store = Arc::new(LocalStore::open(&dir).unwrap());
    let quota = Quota {
        max_bytes: 50,
        max_files: 1000,
    };
    let far = now_ms() + 3_600_000;
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { put(&store, meta("alice", "s1", &format!("f{i}"), far), quota).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(StoreError::Quota(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok, 10);
    assert_eq!(usage(&store, "alice").await, (50, 10));
    assert_eq!(store.list("alice", "s1").await.unwrap().len(), 10);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
#[tokio::test]
async fn renew_moves_a_files_time_unless_it_is_due_already() {
    let dir = test_dir("renew");
    let store = LocalStore::open(&dir).unwrap();
    let now = now_ms();
    put(&store, meta("p", "s", "live", now + 1_000), ROOMY).await.unwrap();
    put(&store, meta("p", "s", "due", now - 1), ROOMY).await.unwrap();
    let files = [
        ("s".to_string(), "live".to_string()),
        ("s".to_string(), "due".to_string()),
    ];
    store.renew("p", &files, now, now + 60_000).await.unwrap();
    // The renewed file outlives its old time, in the records and the sweep's index.
    assert_eq!(store.sweep(now + 2_000).await.unwrap(), 1, "only the due one");
    let live = store.get("p", "s", "live").await.unwrap().unwrap();
    assert_eq!(live.expires_ms, now + 60_000);
    assert_eq!(usage(&store, "p").await, (5, 1));
    assert_eq!(store.sweep(now + 60_001).await.unwrap(), 1);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_workspace_is_held_by_one_holder_until_given_back_or_its_lease_ends() {
    let dir = test_dir("workspace");
    let store = LocalStore::open(&dir).unwrap();
    let file = |name: &str| WorkspaceFile {
        name: name.into(),
        session_id: "s".into(),
        id: name.into(),
    };
    assert_eq!(
        store.workspace_take("p", "w", "h1", 100, 200).await.unwrap(),
        Some(vec![])
    );
    // Held: another holder is refused until the lease ends; another principal's or
    // another name's workspace is another one.
    assert_eq!(store.workspace_take("p", "w", "h2", 150, 300).await.unwrap(), None);
    assert!(store.workspace_take("q", "w", "h2", 150, 300).await.unwrap().is_some());
    assert!(store.workspace_take("p", "v", "h2", 150, 300).await.unwrap().is_some());
    store
        .workspace_release("p", "w", "h1", Some(vec![file("a")]))
        .await
        .unwrap();
    assert_eq!(
        store.workspace_take("p", "w", "h2", 160, 300).await.unwrap(),
        Some(vec![file("a")])
    );
    // A holder whose lease was taken over changes nothing when it gives it back.
    assert_eq!(
        store.workspace_take("p", "w", "h3", 301, 400).await.unwrap(),
        Some(vec![file("a")])
    );
    store
        .workspace_release("p", "w", "h2", Some(vec![file("stale")]))
        .await
        .unwrap();
    store.workspace_release("p", "w", "h3", None).await.unwrap();
    assert_eq!(
        store.workspace_take("p", "w", "h4", 302, 400).await.unwrap(),
        Some(vec![file("a")])
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn session_start() -> SessionStart {
    SessionStart {
        principal: "p".into(),
        request: sandcall_api::ProgrammaticRequest {
            code: Some("print(1)".into()),
            ..Default::default()
        },
        seed: 7,
        hash_seed: 9,
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

#[tokio::test]
async fn dormant_sessions_are_indexed_counted_and_named_in_the_store() {
    let dir = test_dir("dormancy");
    std::fs::create_dir_all(&dir).unwrap();
    let store = EmbeddedSessionStore::open(&dir).unwrap();
    super::super::check_dormancy(&store, "S", "p").await;
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_journal_keeps_its_steps_in_order_and_a_token_is_consumed_once() {
    let dir = test_dir("journal");
    std::fs::create_dir_all(&dir).unwrap();
    let store = EmbeddedSessionStore::open(&dir).unwrap();
    store
        .create("S", &session_start(), &SessionState::default())
        .await
        .unwrap();
    let paused = SessionState {
        pause: 1,
        open: true,
        outstanding: vec!["a".into(), "b".into()],
        stdout_sent: 3,
        ..Default::default()
    };
    store.append("S", &[call("a"), call("b")], &paused).await.unwrap();
    let answered = SessionState {
        open: false,
        outstanding: vec![],
        ..paused.clone()
    };
    let reply = JournalEntry::Reply {
        call_id: "a".into(),
        reply: sandcall_sandbox::protocol::ToolReply::error("tool_error", "no"),
    };
    // Only the current, open pause's token is consumed, and only once.
    assert!(!store
        .consume("S", 2, std::slice::from_ref(&reply), &answered)
        .await
        .unwrap());
    assert!(store
        .consume("S", 1, std::slice::from_ref(&reply), &answered)
        .await
        .unwrap());
    assert!(!store
        .consume("S", 1, std::slice::from_ref(&reply), &answered)
        .await
        .unwrap());
    drop(store);
    // It survives a reopen, in order.
    let store = EmbeddedSessionStore::open(&dir).unwrap();
    let journal = store.load("S").await.unwrap().unwrap();
    assert_eq!(journal.state, answered);
    assert_eq!(store.state("S").await.unwrap(), Some(answered.clone()));
    assert_eq!(journal.start.seed, 7);
    let ids: Vec<String> = journal
        .entries
        .iter()
        .map(|e| match e {
            JournalEntry::Call { call_id, .. } => format!("call {call_id}"),
            JournalEntry::Reply { call_id, .. } => format!("reply {call_id}"),
        })
        .collect();
    assert_eq!(ids, ["call a", "call b", "reply a"]);
    let listed = store.list().await.unwrap();
    assert_eq!(listed, vec![("S".to_string(), "p".to_string(), answered.clone())]);
    // Ownership: another owner waits for the lease to run out.
    assert!(store.claim("S", "n1", 100, 200).await.unwrap());
    assert!(!store.claim("S", "n2", 150, 300).await.unwrap());
    assert!(store.claim("S", "n1", 150, 300).await.unwrap());
    assert!(store.claim("S", "n2", 301, 400).await.unwrap());
    assert_eq!(store.owner("S", 350).await.unwrap().as_deref(), Some("n2"));
    assert_eq!(store.owner("S", 400).await.unwrap(), None);
    store.release("S", "n1").await.unwrap();
    assert_eq!(store.owner("S", 350).await.unwrap().as_deref(), Some("n2"));
    store.release("S", "n2").await.unwrap();
    assert_eq!(store.owner("S", 350).await.unwrap(), None);
    assert_eq!(
        store.entry("S").await.unwrap(),
        Some(("p".to_string(), answered.clone()))
    );
    store.remove("S").await.unwrap();
    assert!(store.load("S").await.unwrap().is_none());
    assert!(store.list().await.unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
