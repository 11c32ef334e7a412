//! Tool servers (`mcp_servers`, whose tools programs call through sandcall) as a way to
//! sandcall's secrets or between tenants: each is started with a cleared environment
//! (its config's `env` and a minimal PATH), as one process per principal unless its
//! config says `shared`, stopped when idle, and bounded in number
//! (`max_mcp_processes`). The tool server is tests/tool_servers/probe.py: its `whoami`
//! answers its pid, its count of calls and its environment.

use crate::common::{processes_matching, settle, Server};
use crate::files::Client;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";
const ROUTE: &str = "/v1/exec/programmatic";

/// Secrets the server is given, none of which may reach a tool server.
const TOKEN_SECRET: &str = "5ec2e7005ec2e7005ec2e7005ec2e7005ec2e7005ec2e7005ec2e7005ec2e700";
const AWS_SECRET: &str = "aws-secret-for-sandcall-tool-server-test";

/// A server whose config has the tool server `probe` (with `server_lines` in its table
/// and `extra` config lines), keyed for alice and bob; and the probe's path, which its
/// processes' command lines hold (a busy probe creates `busy` beside it).
fn server_with_probe(server_lines: &str, extra: &str) -> (Server, PathBuf) {
    let dir = Server::new_dir();
    let probe = dir.join("probe.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tool_servers/probe.py"),
        &probe,
    )
    .unwrap();
    let config = format!(
        "{extra}\n[[mcp_servers]]\nname = \"probe\"\ncommand = \"/usr/bin/python3\"\nargs = [{:?}]\n\
         env = {{ PROBE_SETTING = \"configured\", PROBE_BUSY = {:?} }}\n{server_lines}\n",
        probe.display().to_string(),
        probe.with_file_name("busy").display().to_string(),
    );
    let env = [
        ("SANDCALL_API_KEYS", KEYS),
        ("SANDCALL_TOKEN_SECRET", TOKEN_SECRET),
        ("AWS_ACCESS_KEY_ID", "AKIASANDCALLTEST"),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET),
    ];
    (Server::launch(dir, &env, &config, None), probe)
}

/// What the probe answers one program of `key`'s principal that calls `whoami` with
/// `arguments`: its report, or `{"error": ...}` when the call was refused. The tool is
/// declared in the request (`mcp_server`); `listed` asks the probe for it instead
/// (`mcp_servers`), which is a call to the principal's process too.
fn whoami(s: &Server, key: &str, arguments: &str) -> Value {
    whoami_with(s, key, arguments, false)
}

fn whoami_with(s: &Server, key: &str, arguments: &str, listed: bool) -> Value {
    let code = format!(
        "import json\ntry:\n    print(json.dumps(whoami({arguments})))\nexcept ToolError as e:\n    \
         print(json.dumps({{'error': str(e)}}))\n"
    );
    let mut body = json!({"language": "python", "code": code, "timeout": 60000});
    if listed {
        body["mcp_servers"] = json!(["probe"]);
    } else {
        body["tools"] = json!([{
            "name": "whoami",
            "mcp_server": "probe",
            "parameters": {"type": "object", "properties": {"sleep": {"type": "number"}}},
        }]);
    }
    let reply = Client::api_key(s, key).post_json(ROUTE, &body);
    let r = reply.json();
    assert_eq!(r["status"], "completed", "{r}");
    serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"))
}

/// The server still runs a program (keyed: `Server::assert_healthy` sends no key).
fn assert_healthy(s: &Server) {
    let r = Client::api_key(s, ALICE).exec(json!({"code": "print(6 * 7)"}));
    assert_eq!(r["stdout"], "42\n", "{r}");
}

fn probes(probe: &Path) -> usize {
    processes_matching(&probe.display().to_string()).len()
}

#[test]
fn a_tool_server_gets_only_its_configured_environment_and_a_path() {
    let (s, _) = server_with_probe("", "");
    let report = whoami_with(&s, ALICE, "", true);
    let env = report["env"].as_object().unwrap_or_else(|| panic!("{report}"));
    let text = report["env"].to_string();
    for secret in [ALICE, BOB, TOKEN_SECRET, AWS_SECRET, "AKIASANDCALLTEST"] {
        assert!(!text.contains(secret), "a secret reached the tool server: {report}");
    }
    assert!(
        !env.keys().any(|k| k.starts_with("SANDCALL_") || k.starts_with("AWS_")),
        "{report}"
    );
    // Python adds LC_CTYPE itself when it finds the C locale (PEP 538).
    let names: Vec<&str> = env.keys().map(String::as_str).filter(|k| *k != "LC_CTYPE").collect();
    assert_eq!(names, ["PATH", "PROBE_BUSY", "PROBE_SETTING"], "{report}");
    assert_eq!(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert_eq!(env["PROBE_SETTING"], "configured");
    assert_healthy(&s);
}

#[test]
fn each_principal_calls_its_own_tool_server_process() {
    let (s, probe) = server_with_probe("", "");
    let a1 = whoami(&s, ALICE, "");
    let b1 = whoami(&s, BOB, "");
    let a2 = whoami(&s, ALICE, "");
    // Alice's second call reaches the process of her first; Bob's, one of his own that
    // never saw her calls.
    assert_eq!(a1["pid"], a2["pid"], "{a1} {a2}");
    assert_eq!((a1["calls"].as_u64(), a2["calls"].as_u64()), (Some(1), Some(2)));
    assert_ne!(a1["pid"], b1["pid"], "{a1} {b1}");
    assert_eq!(b1["calls"], 1, "{b1}");
    assert_eq!(probes(&probe), 2);
    assert_healthy(&s);
}

#[test]
fn a_shared_tool_server_is_one_process_for_every_principal() {
    let (s, probe) = server_with_probe("shared = true", "");
    let a = whoami(&s, ALICE, "");
    let b = whoami(&s, BOB, "");
    assert_eq!(a["pid"], b["pid"], "{a} {b}");
    assert_eq!((a["calls"].as_u64(), b["calls"].as_u64()), (Some(1), Some(2)));
    assert_eq!(probes(&probe), 1);
    assert_healthy(&s);
}

#[test]
fn an_idle_tool_server_is_stopped_and_the_next_call_starts_another() {
    let (s, probe) = server_with_probe("", "mcp_idle_stop_s = 2\n");
    let first = whoami(&s, ALICE, "");
    assert_eq!(probes(&probe), 1, "{first}");
    // Idle two seconds, it is stopped (the reaper looks every half second).
    assert_eq!(settle(|| probes(&probe), 0), 0, "an idle tool server was not stopped");
    let second = whoami(&s, ALICE, "");
    assert_ne!(first["pid"], second["pid"]);
    assert_eq!(second["calls"], 1, "{second}");
    assert_healthy(&s);
}

#[test]
fn tool_server_processes_are_bounded_idle_ones_give_way_busy_ones_refuse() {
    let (s, probe) = server_with_probe("", "max_mcp_processes = 1\n");
    let a = whoami(&s, ALICE, "");
    // Bob's process takes the only place: Alice's, idle, is stopped for it.
    let b = whoami(&s, BOB, "");
    assert_ne!(a["pid"], b["pid"]);
    let alive = |pid: &Value| Path::new(&format!("/proc/{pid}")).exists();
    assert!(
        !settle(|| alive(&a["pid"]), false),
        "alice's idle process was not stopped"
    );
    assert_eq!(probes(&probe), 1);
    // While Bob's process answers a slow call, Alice's call has no place: refused.
    let busy = std::thread::scope(|scope| {
        let slow = scope.spawn(|| whoami(&s, BOB, "sleep=8"));
        let marked = || probe.with_file_name("busy").exists();
        assert!(settle(marked, true), "bob's slow call did not reach the tool server");
        let refused = whoami(&s, ALICE, "");
        (slow.join().unwrap(), refused)
    });
    assert_eq!(busy.0["pid"], b["pid"], "{}", busy.0);
    let error = busy.1["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not refused: {}", busy.1));
    assert!(error.contains("max_mcp_processes"), "{error}");
    assert_eq!(probes(&probe), 1);
    assert_healthy(&s);
}
