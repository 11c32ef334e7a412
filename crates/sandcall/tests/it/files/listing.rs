//! What the store holds and answers: listing at each detail level, object metadata,
//! deletion, routes that cannot walk the store, retention (file_ttl) and the documented
//! fields of the answers.

use super::client::{assert_error, assert_nanoid, field_part, file_part, Client, NO_SUCH_ID};
use super::support::{
    assert_no_secrets, contains, download_output, host_secrets, inherited_names, output, output_names, regular_files,
    session_of, sha256_hex, stored_count, strings, unique,
};
use crate::common::Server;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[test]
fn list_objects_and_delete() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("notes.md", "text/markdown", b"# notes\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat notes.md > copy.md && echo extra >> copy.md && printf 'abc' > data.bin",
        "files": [up.input("notes.md")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), strings(&["copy.md", "data.bin"]), "{r}");
    assert_eq!(inherited_names(&r), strings(&["notes.md"]), "{r}");
    let run = session_of(&r);

    // Listing a session.
    let listed = c.list(&run);
    assert_eq!(listed.len(), 2, "{listed:?}");
    let mut names: Vec<&str> = listed.iter().map(|f| f["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["copy.md", "data.bin"]);
    for f in &listed {
        assert_nanoid(&f["id"], &json!(listed));
        assert!(!f["lastModified"].is_null(), "{f}");
        assert!(f["contentType"].is_string(), "{f}");
        let out = output(&r, f["name"].as_str().unwrap());
        assert_eq!(f["id"], out["id"], "{f}");
        assert_eq!(f["size"], out["size"], "{f}");
    }
    let uploads = c.list(&up.session_id);
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    assert_eq!(uploads[0]["id"], up.id.as_str());
    assert_eq!(uploads[0]["name"], "notes.md");
    assert_eq!(uploads[0]["size"], 8);
    // An unknown session is an empty list.
    assert!(c.list(NO_SUCH_ID).is_empty());

    // Object metadata, without the bytes.
    let data = output(&r, "data.bin");
    let reply = c.object(&run, data["id"].as_str().unwrap());
    assert_eq!(reply.status, 200, "{reply}");
    let o = reply.json();
    assert_eq!(o["size"], 3, "{o}");
    assert!(o["contentType"].is_string(), "{o}");
    assert!(o["etag"].as_str().is_some_and(|e| !e.is_empty()), "{o}");
    let modified = o["lastModified"].as_str().unwrap_or_else(|| panic!("{o}"));
    let b = modified.as_bytes();
    assert!(
        b.len() >= 19 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':',
        "lastModified is not ISO 8601: {o}"
    );
    let reply = c.object(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["size"], 8, "{reply}");
    assert_error(&c.object(&run, NO_SUCH_ID), 404, "file_not_found");

    // Delete: 200 with what was deleted, then gone from every route.
    let copy_id = output(&r, "copy.md")["id"].as_str().unwrap().to_owned();
    let reply = c.delete_file(&run, &copy_id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json(),
        json!({"message": "File deleted successfully", "session_id": run, "fileId": copy_id})
    );
    assert_error(&c.download(&run, &copy_id), 404, "file_not_found");
    assert_error(&c.object(&run, &copy_id), 404, "file_not_found");
    let listed = c.list(&run);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "data.bin");
    assert_error(&c.delete_file(&run, &copy_id), 404, "file_not_found");
    assert_error(&c.delete_file(&run, NO_SUCH_ID), 404, "file_not_found");
    // The other files are untouched.
    assert_eq!(download_output(&c, &r, "data.bin"), b"abc");
    assert_eq!(c.download(&up.session_id, &up.id).body, b"# notes\n");
    // A deleted input cannot be staged any more.
    let reply = c.delete_file(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    let reply = c.post_json(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [up.input("notes.md")]}),
    );
    assert_error(&reply, 404, "file_not_found");
}

#[test]
fn list_detail_levels_and_filters() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_parts(&[
        field_part("kind", "user"),
        field_part("id", "user_1"),
        field_part("read_only", "true"),
        file_part("docs/a.txt", "text/plain", b"hello"),
        file_part("notes", "text/plain", b"all:\n"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let a = v["files"][0]["id"].as_str().unwrap().to_owned();
    let m = v["files"][1]["id"].as_str().unwrap().to_owned();
    let a_name = format!("{sid}/{a}.txt");
    let m_name = format!("{sid}/{m}");

    // simple, the default: object names, with the extension if any.
    let simple = c.list_detail(&sid, "");
    assert_eq!(simple, vec![json!(a_name), json!(m_name)]);
    assert_eq!(c.list_detail(&sid, "detail=simple"), simple);

    let etag = format!("\"{}\"", sha256_hex(b"hello"));
    let summary = c.list_detail(&sid, "detail=summary");
    assert_eq!(summary.len(), 2);
    let modified = summary[0]["lastModified"].clone();
    assert!(modified.is_string(), "{summary:?}");
    assert_eq!(
        summary[0],
        json!({"name": a_name, "size": 5, "lastModified": modified, "etag": etag})
    );

    let full = c.list_detail(&sid, "detail=full");
    assert_eq!(
        full[0],
        json!({"name": a_name, "size": 5, "lastModified": modified, "etag": etag,
            "metadata": {"content-type": "text/plain", "original-filename": "docs/a.txt",
                "original-filename-encoded": "none"},
            "contentType": "text/plain"})
    );
    assert_eq!(full[1]["metadata"]["original-filename"], "notes");

    let normalized = c.list_detail(&sid, "detail=normalized");
    assert_eq!(
        normalized[0],
        json!({"id": a, "name": "docs/a.txt", "storage_session_id": sid, "size": 5,
            "contentType": "text/plain", "lastModified": modified, "read_only": true})
    );

    // The client's own query: kind and id of the uploader.
    assert_eq!(c.list_detail(&sid, "detail=full&kind=user&id=user_1").len(), 2);
    assert!(c.list_detail(&sid, "detail=full&kind=skill").is_empty());
    assert!(c.list_detail(&sid, "detail=full&kind=user&id=user_2").is_empty());
    // An unknown detail is refused; unknown sessions are empty at every level.
    assert_error(
        &c.get(&format!("/v1/files/{sid}?detail=everything")),
        400,
        "invalid_request",
    );
    assert!(c.list_detail(NO_SUCH_ID, "detail=summary").is_empty());

    // The object name from the list reaches the file on the other routes too.
    let got = c.get(&format!("/v1/download/{a_name}"));
    assert_eq!(got.status, 200, "{got}");
    assert_eq!(got.body, b"hello");
    assert_eq!(c.object(&sid, &format!("{a}.txt")).json()["size"], 5);
    let reply = c.delete(&format!("/v1/files/{a_name}"));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json(),
        json!({"message": "File deleted successfully", "session_id": sid, "fileId": a})
    );
    assert_eq!(c.list_detail(&sid, ""), vec![json!(m_name)]);
}

#[test]
fn file_routes_cannot_walk_the_store() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    let secrets = host_secrets(&s);
    let before = regular_files(&s.data_dir);
    let sid = &up.session_id;
    let real_sid = sid.clone();
    for (sid, fid) in [
        ("..", "meta.redb"),
        ("..%2F..", "token.key"),
        ("%2E%2E", "%2E%2E%2Ftoken.key"),
        (sid.as_str(), "..%2F..%2Fmeta.redb"),
        (sid.as_str(), "%2E%2E%2F%2E%2E%2F%2E%2E%2Ftoken.key"),
        ("..%2F..%2F..%2F..%2F..%2Fetc", "passwd"),
    ] {
        for reply in [c.download(sid, fid), c.object(sid, fid), c.delete_file(sid, fid)] {
            assert!(reply.status == 404 || reply.status == 400, "{sid}/{fid}: {reply}");
            assert_no_secrets(&s, &secrets, &[reply.body]);
        }
        let reply = c.get(&format!("/v1/files/{sid}"));
        assert!(
            reply.status == 200 || reply.status == 404 || reply.status == 400,
            "{reply}"
        );
        // Listing the real session legitimately shows its file; nothing else lists.
        if reply.status == 200 && sid != real_sid {
            assert_eq!(reply.json(), json!([]), "{reply}");
        }
    }
    // Nothing was deleted.
    let after = regular_files(&s.data_dir);
    for path in &before {
        assert!(after.contains(path), "{} is gone", path.display());
    }
    assert_eq!(c.download(&up.session_id, &up.id).body, b"x\n");
}

#[test]
fn files_expire_after_file_ttl() {
    const TTL_S: u64 = 5;
    let s = Server::start_with(
        &[
            ("SANDCALL_FILE_TTL_S", &TTL_S.to_string()),
            ("SANDCALL_FILE_SWEEP_INTERVAL_S", "1"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    let baseline = stored_count(&s);
    let marker_in = unique(&s, "retained-input");
    let marker_out = unique(&s, "retained-output");
    let t = Instant::now();
    let up = c.upload("notes.txt", "text/plain", marker_in.as_bytes());
    let r = c.exec(json!({
        "code": "import sys\nopen('out.txt', 'w').write(sys.argv[1])\nprint(open('notes.txt').read())",
        "args": [marker_out],
        "files": [up.input("notes.txt")],
    }));
    assert_eq!(r["stdout"], format!("{marker_in}\n"), "{r}");
    let run = session_of(&r);
    let out_id = output(&r, "out.txt")["id"].as_str().unwrap().to_owned();
    // Both are there while young.
    assert_eq!(c.download(&up.session_id, &up.id).body, marker_in.as_bytes());
    assert_eq!(c.download(&run, &out_id).body, marker_out.as_bytes());
    assert_eq!(c.list(&up.session_id).len(), 1);
    assert_eq!(c.list(&run).len(), 1);
    assert_eq!(stored_count(&s), baseline + 2);

    // Then gone, from every route and from the disk.
    let holds_marker = || {
        regular_files(&s.data_dir).iter().any(|p| {
            let bytes = std::fs::read(p).unwrap_or_default();
            contains(&bytes, marker_in.as_bytes()) || contains(&bytes, marker_out.as_bytes())
        })
    };
    let mut first_gone = None;
    loop {
        let gone_in = c.download(&up.session_id, &up.id).status == 404;
        let gone_out = c.download(&run, &out_id).status == 404;
        if (gone_in || gone_out) && first_gone.is_none() {
            first_gone = Some(t.elapsed());
        }
        if gone_in
            && gone_out
            && c.list(&up.session_id).is_empty()
            && c.list(&run).is_empty()
            && stored_count(&s) == baseline
            && !holds_marker()
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(TTL_S + 25),
            "not expired after {:?}: {} stored files (baseline {baseline})",
            t.elapsed(),
            stored_count(&s)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let first_gone = first_gone.unwrap_or_default();
    assert!(
        first_gone >= Duration::from_millis(TTL_S * 1000 - 500),
        "a file expired after {first_gone:?}, before its ttl of {TTL_S} s"
    );
    assert_error(&c.download(&up.session_id, &up.id), 404, "file_not_found");
    assert_error(&c.object(&run, &out_id), 404, "file_not_found");
    let reply = c.post_json(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [up.input("notes.txt")]}),
    );
    assert_error(&reply, 404, "file_not_found");
    s.assert_healthy();
}

/// The file answers match their schemas in docs/openapi.json: every required field is
/// answered, every answered field is documented.
#[test]
fn file_answers_have_the_documented_fields() {
    let doc: Value = serde_json::from_str(include_str!("../../../../../docs/openapi.json")).unwrap();
    let schemas = &doc["components"]["schemas"];
    let check = |name: &str, answer: &Value| {
        let schema = &schemas[name];
        for field in schema["required"].as_array().unwrap_or_else(|| panic!("{name}")) {
            let field = field.as_str().unwrap();
            assert!(
                answer.get(field).is_some(),
                "{name}.{field} is documented but missing: {answer}"
            );
        }
        for key in answer.as_object().unwrap_or_else(|| panic!("{name}: {answer}")).keys() {
            assert!(
                schema["properties"].get(key).is_some(),
                "{name}.{key} is answered but not documented"
            );
        }
    };
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("read_only", "true"),
        file_part("a/b.txt", "text/plain", b"b"),
        file_part("../x", "text/plain", b"x"),
    ]);
    let batch = reply.json();
    check("BatchUploadResponse", &batch);
    check("BatchFileResult", &batch["files"][0]);
    check("BatchFileResult", &batch["files"][1]);
    let sid = batch["storage_session_id"].as_str().unwrap();
    let fid = batch["files"][0]["fileId"].as_str().unwrap();
    let failed = c.upload_batch(&[file_part("../x", "text/plain", b"x")]).json();
    check("BatchUploadResponse", &failed);
    check("FileSummary", &c.list_detail(sid, "detail=summary")[0]);
    let full = c.list_detail(sid, "detail=full");
    check("FileFull", &full[0]);
    check("FileObjectMetadata", &full[0]["metadata"]);
    check("FileNormalized", &c.list_detail(sid, "detail=normalized")[0]);
    let up = c.upload("in.txt", "text/plain", b"in");
    let r = c.exec(json!({
        "code": "open('in.txt', 'a').write('!'); open('new.txt', 'w').write('n')",
        "files": [up.input("in.txt"), {"id": fid, "storage_session_id": sid, "name": "a/b.txt", "entity_id": "e"}],
    }));
    for f in r["files"].as_array().unwrap() {
        check("OutputFile", f);
    }
    check("FileOrigin", &output(&r, "in.txt")["modified_from"]);
    check("DeleteFileResponse", &c.delete_file(sid, fid).json());
}
