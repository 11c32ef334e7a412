//! Uploaded files as a run's inputs: staged at their names, refused before the run when
//! their names or ids are bad or they cannot fit, and returned inherited, modified or
//! read-only; on /v1/exec and on the programmatic route.

use super::client::{assert_error, field_part, file_part, Client, NO_SUCH_ID};
use super::support::{assert_outputs_shape, download_output, inherited_names, output, output_names, src, strings};
use crate::common::Server;
use serde_json::json;

#[test]
fn unchanged_inputs_come_back_inherited_and_changed_ones_as_new_files() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let keep = c.upload("keep.txt", "text/plain", b"keep me\n");
    let grow = c.upload("grow.txt", "text/plain", b"line 1\n");
    let r = c.exec(json!({
        "code": src(&[
            "print(open('keep.txt').read(), end='')",
            "with open('grow.txt', 'a') as f:",
            "    f.write('line 2\\n')",
        ]),
        "files": [keep.input("keep.txt"), grow.input("grow.txt")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "keep me\n", "{r}");
    assert_eq!(output_names(&r), strings(&["grow.txt"]), "{r}");
    let out = output(&r, "grow.txt");
    assert_eq!(out["storage_session_id"], r["session_id"], "{r}");
    assert_ne!(out["id"], grow.id.as_str(), "a changed input is a new file: {r}");
    assert_eq!(
        out["modified_from"],
        json!({"id": grow.id, "storage_session_id": grow.session_id}),
        "{r}"
    );
    assert!(out.get("inherited").is_none(), "{r}");
    // The unchanged input comes back as it was: its own id and storage session.
    assert_eq!(inherited_names(&r), strings(&["keep.txt"]), "{r}");
    assert_eq!(
        output(&r, "keep.txt"),
        &json!({"id": keep.id, "name": "keep.txt", "storage_session_id": keep.session_id, "size": 8, "inherited": true}),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "grow.txt"), b"line 1\nline 2\n");
    // What the sandbox wrote never reaches the stored original.
    assert_eq!(c.download(&grow.session_id, &grow.id).body, b"line 1\n");
    assert_eq!(c.download(&keep.session_id, &keep.id).body, b"keep me\n");

    // Inputs are staged read-write, and each run gets its own copy.
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat grow.txt; echo changed > grow.txt; rm keep.txt",
        "files": [keep.input("keep.txt"), grow.input("grow.txt")],
    }));
    assert_eq!(r["stdout"], "line 1\n", "{r}");
    assert_eq!(output_names(&r), strings(&["grow.txt"]), "{r}");
    // A deleted input is not inherited.
    assert!(inherited_names(&r).is_empty(), "{r}");
    assert_eq!(download_output(&c, &r, "grow.txt"), b"changed\n");
    assert_eq!(c.download(&grow.session_id, &grow.id).body, b"line 1\n");
    assert_eq!(c.download(&keep.session_id, &keep.id).body, b"keep me\n");
}

#[test]
fn inputs_in_sub_folders_and_the_session_id_alias() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let a = c.upload("x.csv", "text/csv", b"1,2\n");
    let b = c.upload("y.txt", "text/plain", b"why\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat data/x.csv a/b/c/why.txt; cat top.txt",
        "files": [
            a.input("data/x.csv"),
            {"id": b.id, "session_id": b.session_id, "name": "a/b/c/why.txt", "kind": "user", "version": 3},
            {"id": a.id, "storage_session_id": a.session_id, "name": "top.txt"},
        ],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "1,2\nwhy\n1,2\n", "{r}");
    assert!(output_names(&r).is_empty(), "unchanged inputs are not new outputs: {r}");
    assert_eq!(
        inherited_names(&r),
        strings(&["data/x.csv", "a/b/c/why.txt", "top.txt"]),
        "{r}"
    );
}

#[test]
fn bad_input_names_are_400() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    for name in [
        "/etc/passwd",
        "/mnt/data/x.txt",
        "../x.txt",
        "..",
        "a/../../x.txt",
        "data/..",
        "",
        "new\nline.txt",
        "nul\u{0}byte.txt",
        "esc\u{1b}[31m.txt",
    ] {
        let reply = c.post_json("/v1/exec", &json!({"code": "print('ran')", "files": [up.input(name)]}));
        assert_error(&reply, 400, "invalid_request");
        let reply = c.post_json(
            "/v1/exec/programmatic",
            &json!({"code": "print('ran')", "tools": [], "files": [up.input(name)]}),
        );
        assert_error(&reply, 400, "invalid_request");
    }
    // Dots inside a name are fine.
    let r = c.exec(json!({"code": "print(open('a..b').read(), end='')", "files": [up.input("a..b")]}));
    assert_eq!(r["stdout"], "x\n", "{r}");
}

#[test]
fn unknown_or_malformed_input_ids_are_404() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    for file in [
        json!({"id": NO_SUCH_ID, "storage_session_id": up.session_id, "name": "x.txt"}),
        json!({"id": up.id, "storage_session_id": NO_SUCH_ID, "name": "x.txt"}),
        json!({"id": up.id, "session_id": NO_SUCH_ID, "name": "x.txt"}),
        // Ids that try to walk the store's directories.
        json!({"id": "../meta.redb", "storage_session_id": "..", "name": "x.txt"}),
        json!({"id": "../../token.key", "storage_session_id": up.session_id, "name": "x.txt"}),
        json!({"id": up.id, "storage_session_id": format!("../{}", up.session_id), "name": "x.txt"}),
    ] {
        let reply = c.post_json("/v1/exec", &json!({"code": "print('ran')", "files": [file]}));
        assert_error(&reply, 404, "file_not_found");
        let reply = c.post_json(
            "/v1/exec/programmatic",
            &json!({"code": "print('ran')", "tools": [], "files": [file]}),
        );
        assert_error(&reply, 404, "file_not_found");
    }
}

#[test]
fn programmatic_runs_take_inputs_and_return_outputs() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("prices.txt", "text/plain", b"10\n20\n");
    let tool = json!({
        "name": "convert",
        "description": "converts an amount",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
    });
    let reply = c.post_json(
        "/v1/exec/programmatic",
        &json!({
            "language": "python",
            "code": src(&[
                "total = sum(int(x) for x in open('input/prices.txt').read().split())",
                "converted = convert(amount=total)",
                "with open('result.txt', 'w') as f:",
                "    f.write(f'{total} -> {converted}\\n')",
                "print('done')",
            ]),
            "tools": [tool],
            "files": [{"id": up.id, "storage_session_id": up.session_id, "name": "input/prices.txt",
                "kind": "user", "entity_id": "agent_7"}],
        }),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let paused = reply.json();
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let call = &paused["tool_calls"][0];
    assert_eq!(call["arguments"], json!({"amount": 30}), "{paused}");
    let reply = c.post_json(
        "/v1/exec/programmatic",
        &json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": 27.6, "is_error": false}],
        }),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let done = reply.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "done\n", "{done}");
    assert_eq!(output_names(&done), strings(&["result.txt"]), "{done}");
    assert_outputs_shape(&done);
    assert_eq!(download_output(&c, &done, "result.txt"), b"30 -> 27.6\n");
    // The input comes back inherited, with the entity_id the request gave it.
    assert_eq!(
        output(&done, "input/prices.txt"),
        &json!({"id": up.id, "name": "input/prices.txt", "storage_session_id": up.session_id, "size": 6,
            "inherited": true, "entity_id": "agent_7"}),
        "{done}"
    );
}

#[test]
fn read_only_inputs_are_never_returned_as_new_outputs() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("read_only", "true"),
        file_part("skill/tool.py", "text/x-python", b"X = 1\n"),
        file_part("skill/data.txt", "text/plain", b"data\n"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let tool = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    let data = v["files"][1]["fileId"].as_str().unwrap().to_owned();
    let user = c.upload("notes.txt", "text/plain", b"n\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "echo 'X = 2' > skill/tool.py; rm skill/data.txt; echo more >> notes.txt; echo new > new.txt",
        "files": [
            {"id": tool, "storage_session_id": sid, "name": "skill/tool.py", "entity_id": "skill_1"},
            {"id": data, "storage_session_id": sid, "name": "skill/data.txt"},
            user.input("notes.txt"),
        ],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    // Changed or deleted, a read-only input comes back as it was; the writable one that
    // changed is a new file.
    assert_eq!(output_names(&r), strings(&["new.txt", "notes.txt"]), "{r}");
    assert_eq!(
        inherited_names(&r),
        strings(&["skill/tool.py", "skill/data.txt"]),
        "{r}"
    );
    assert_eq!(
        output(&r, "skill/tool.py"),
        &json!({"id": tool, "name": "skill/tool.py", "storage_session_id": sid, "size": 6,
            "inherited": true, "entity_id": "skill_1"}),
        "{r}"
    );
    assert!(output(&r, "skill/data.txt").get("entity_id").is_none(), "{r}");
    assert_eq!(
        output(&r, "notes.txt")["modified_from"],
        json!({"id": user.id, "storage_session_id": user.session_id}),
        "{r}"
    );
    assert!(r["files_skipped"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(c.download(&sid, &tool).body, b"X = 1\n");
    // A run that leaves nothing at all still returns its read-only inputs.
    let r = c.exec(json!({
        "language": "bash",
        "code": "rm -rf skill",
        "files": [{"id": tool, "storage_session_id": sid, "name": "skill/tool.py"}],
    }));
    assert_eq!(inherited_names(&r), strings(&["skill/tool.py"]), "{r}");
    assert!(output_names(&r).is_empty(), "{r}");
}

#[test]
fn inputs_that_cannot_fit_or_clash_are_refused_before_the_run() {
    let s = Server::start_with(&[("SANDCALL_WORKSPACE_LIMIT_MB", "1")], "");
    let c = Client::anonymous(&s);
    let big = c.upload("big.bin", "application/octet-stream", &vec![7u8; (1 << 20) - 100]);
    let small = c.upload("small.txt", "text/plain", b"tiny");
    // Together they are within a byte count of 1 MiB, but not in tmpfs pages.
    let r = s.post(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [
            {"id": big.id, "storage_session_id": big.session_id, "name": "a.bin"},
            {"id": small.id, "storage_session_id": small.session_id, "name": "b.txt"}]}),
    );
    assert_eq!(r.0, 413, "{}", r.1);
    // One name a folder of the other.
    let r = s.post(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [
            {"id": small.id, "storage_session_id": small.session_id, "name": "a"},
            {"id": small.id, "storage_session_id": small.session_id, "name": "a/b"}]}),
    );
    assert_eq!(r.0, 400, "{}", r.1);
    assert_eq!(r.1["error_type"], "invalid_request");
    s.assert_healthy();
}
