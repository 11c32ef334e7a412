//! Uploads, one file or several, single or batch, and their names; downloads of what was
//! uploaded or written, byte for byte.

use super::client::{assert_error, assert_nanoid, field_part, file_part, Client, Part};
use super::support::{
    assert_outputs_shape, batch_outcomes, download_output, inherited_names, output, output_names, regular_files,
    session_of, sha256_hex, src, stored_count, strings, unique,
};
use crate::common::Server;
use serde_json::json;
use std::path::{Path, PathBuf};

#[test]
fn upload_exec_download_round_trip() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let csv = b"city,temp\nOslo,4\nLima,19\n";
    let up = c.upload("weather.csv", "text/csv", csv);
    let v = &up.response;
    assert_eq!(up.name, "weather.csv");
    assert_eq!(v["message"], "success", "{v}");
    assert_nanoid(&v["storage_session_id"], v);
    let f = &v["files"][0];
    assert_nanoid(&f["id"], v);
    assert_eq!(f["fileId"], f["id"], "{v}");
    assert_eq!(f["name"], "weather.csv", "{v}");
    assert_eq!(f["filename"], "weather.csv", "{v}");
    assert_eq!(f["storage_session_id"], v["storage_session_id"], "{v}");
    assert_eq!(f["size"], csv.len(), "{v}");
    assert!(
        f["content_type"].as_str().is_some_and(|t| t.starts_with("text/csv")),
        "{v}"
    );

    let r = c.exec(json!({
        "language": "python",
        "code": src(&[
            "import os",
            "print(os.getcwd())",
            "print(open('weather.csv').read(), end='')",
            "rows = open('/mnt/data/weather.csv').read().splitlines()[1:]",
            "with open('report.txt', 'w') as f:",
            "    f.write(';'.join(r.upper() for r in rows) + '\\n')",
            "with open('chart.png', 'wb') as f:",
            "    f.write(bytes(range(256)) * 4)",
        ]),
        "files": [up.input("weather.csv")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        r["stdout"],
        format!("/mnt/data\n{}", std::str::from_utf8(csv).unwrap()),
        "{r}"
    );
    assert_outputs_shape(&r);
    // Files are listed in sorted path order; the unchanged input is not listed.
    assert_eq!(output_names(&r), strings(&["chart.png", "report.txt"]), "{r}");
    assert_eq!(r["files_skipped"], json!([]), "{r}");
    assert_eq!(r["files_skipped_total"], 0, "{r}");
    let report = b"OSLO,4;LIMA,19\n";
    assert_eq!(output(&r, "report.txt")["size"], report.len(), "{r}");
    assert_eq!(download_output(&c, &r, "report.txt"), report);
    let png: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
    assert_eq!(output(&r, "chart.png")["size"], png.len(), "{r}");
    assert_eq!(download_output(&c, &r, "chart.png"), png);

    // Content types: from the upload, or guessed from the name.
    let chart = output(&r, "chart.png");
    let reply = c.download(&session_of(&r), chart["id"].as_str().unwrap());
    assert!(
        reply
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("image/png")),
        "{reply}"
    );
    let reply = c.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, csv);
    assert!(
        reply.content_type.as_deref().is_some_and(|t| t.starts_with("text/csv")),
        "{reply}"
    );
    // LibreChat adds query parameters; they are ignored.
    let reply = c.get(&format!("/v1/download/{}/{}?kind=user&id=abc", up.session_id, up.id));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, csv);
}

#[test]
fn binary_uploads_come_back_byte_for_byte() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    // Every byte value, CR LF pairs and something that looks like a part boundary.
    let mut data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    data.extend_from_slice(b"\r\n--not-the-boundary\r\n\r\n\0\0");
    let up = c.upload("blob.bin", "application/octet-stream", &data);
    assert_eq!(up.response["files"][0]["size"], data.len());
    let reply = c.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert!(reply.body == data, "the download differs from the upload");
    // The sandbox sees the same bytes.
    let r = c.exec(json!({
        "code": "import hashlib\nprint(hashlib.sha256(open('blob.bin', 'rb').read()).hexdigest())",
        "files": [up.input("blob.bin")],
    }));
    let expected = sha256_hex(&data);
    assert_eq!(r["stdout"], format!("{expected}\n"), "{r}");
}

#[test]
fn upload_takes_several_parts_and_ignores_other_fields() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_parts(&[
        field_part("kind", "user"),
        field_part("entity_id", "agent_123"),
        file_part("one.txt", "text/plain", b"first\n"),
        Part {
            field: "files",
            filename: Some("two.json"),
            content_type: Some("application/json"),
            data: b"{\"n\": 2}",
        },
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let files = v["files"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(files.len(), 2, "{v}");
    let sid = v["storage_session_id"].as_str().unwrap();
    for (f, name, body) in [
        (&files[0], "one.txt", &b"first\n"[..]),
        (&files[1], "two.json", &b"{\"n\": 2}"[..]),
    ] {
        assert_eq!(f["name"], name, "{v}");
        assert_eq!(f["storage_session_id"], sid, "{v}");
        let got = c.download(sid, f["id"].as_str().unwrap());
        assert_eq!(got.status, 200, "{got}");
        assert_eq!(got.body, body);
    }
    assert_ne!(files[0]["id"], files[1]["id"]);

    // No file part at all.
    let reply = c.upload_parts(&[field_part("kind", "user")]);
    assert_error(&reply, 400, "invalid_request");
    // Not multipart.
    let reply = c.send(
        "POST",
        "/v1/upload",
        Some("application/json"),
        Some(b"{\"file\": \"x\"}"),
    );
    assert!((400..500).contains(&reply.status), "{reply}");
    assert!(reply.json()["error_type"].is_string(), "{reply}");
}

#[test]
fn nested_upload_names_are_staged_at_their_path_and_outputs_keep_their_folders() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let script =
        b"import os\nos.makedirs('skill/out', exist_ok=True)\nopen('skill/out/result.txt', 'w').write('ran\\n')\n";
    let reply = c.upload_parts(&[
        field_part("kind", "skill"),
        field_part("id", "skill_42"),
        field_part("version", "3"),
        file_part("skill/scripts/run.py", "text/x-python", script),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["files"][0]["name"], "skill/scripts/run.py", "{v}");
    assert_eq!(v["files"][0]["filename"], "skill/scripts/run.py", "{v}");
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let fid = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    let r = c.exec(json!({
        "lang": "py",
        "code": "import runpy; runpy.run_path('skill/scripts/run.py'); print(open('skill/out/result.txt').read(), end='')",
        "files": [{"id": fid, "resource_id": "r1", "name": "skill/scripts/run.py", "storage_session_id": sid, "kind": "skill"}],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "ran\n", "{r}");
    assert_eq!(output_names(&r), strings(&["skill/out/result.txt"]), "{r}");
    assert_eq!(inherited_names(&r), strings(&["skill/scripts/run.py"]), "{r}");
    assert_eq!(download_output(&c, &r, "skill/out/result.txt"), b"ran\n");
    // Bad names stay refused, nothing stored.
    let before = stored_count(&s);
    for bad in [
        "../x.py",
        "/etc/x.py",
        "a//b.py",
        "a/./b.py",
        "skill/../../x.py",
        "dir/",
    ] {
        let reply = c.upload_parts(&[file_part(bad, "text/plain", b"x")]);
        assert_error(&reply, 400, "invalid_request");
    }
    assert_eq!(stored_count(&s), before);
}

#[test]
fn batch_upload_stores_each_file_on_its_own() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("kind", "skill"),
        field_part("id", "skill_9"),
        file_part("skill/SKILL.md", "text/markdown", b"# skill\n"),
        file_part("../escape.txt", "text/plain", b"no"),
        file_part("skill/scripts/run.sh", "text/x-sh", b"echo hi\n"),
        file_part("/abs.txt", "text/plain", b"no"),
        field_part("read_only", "true"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "partial_success", "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    assert_eq!(
        batch_outcomes(&v),
        vec![
            ("success".into(), "skill/SKILL.md".into(), false),
            ("error".into(), "../escape.txt".into(), true),
            ("success".into(), "skill/scripts/run.sh".into(), false),
            ("error".into(), "/abs.txt".into(), true),
        ]
    );
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    assert_nanoid(&v["storage_session_id"], &v);
    let skill_md = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    assert_nanoid(&v["files"][0]["fileId"], &v);
    assert_eq!(c.download(&sid, &skill_md).body, b"# skill\n");
    // The fields apply to every file, even when sent after them.
    let listed = c.list(&sid);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|f| f["read_only"] == true), "{listed:?}");
    assert_eq!(c.list_detail(&sid, "kind=skill&id=skill_9").len(), 2);

    // Everything good: success.
    let reply = c.upload_batch(&[
        file_part("a.txt", "text/plain", b"a"),
        file_part("b/c.txt", "text/plain", b"c"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "success", "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(2), Some(0)),
        "{v}"
    );
    assert!(v["files"][0].get("error").is_none(), "{v}");

    // Every file failed: 400, the batch body with the error shape's fields too.
    let before = stored_count(&s);
    let reply = c.upload_batch(&[
        file_part("../a", "text/plain", b"a"),
        file_part("x//y", "text/plain", b"b"),
    ]);
    assert_eq!(reply.status, 400, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "error", "{v}");
    assert_eq!(v["error_type"], "invalid_request", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(0), Some(2)),
        "{v}"
    );
    assert_eq!(stored_count(&s), before);
    // No file part, or a bad field: the plain error, nothing stored.
    assert_error(&c.upload_batch(&[field_part("kind", "user")]), 400, "invalid_request");
    let reply = c.upload_batch(&[field_part("read_only", "maybe"), file_part("a.txt", "text/plain", b"a")]);
    assert_error(&reply, 400, "invalid_request");
    // A field sent twice: which value applies would be a guess, so neither route takes it.
    for twice in [
        [field_part("read_only", "true"), field_part("read_only", "false")],
        [field_part("version", "1"), field_part("version", "1")],
        [field_part("id", "a"), field_part("entity_id", "a")],
    ] {
        let parts = [
            twice[0].clone(),
            file_part("a.txt", "text/plain", b"a"),
            twice[1].clone(),
        ];
        let reply = c.upload_batch(&parts);
        assert_error(&reply, 400, "invalid_request");
        assert!(
            reply.json()["error"].as_str().unwrap().contains("more than once"),
            "{reply}"
        );
        assert_error(&c.upload_parts(&parts), 400, "invalid_request");
    }
    assert_eq!(stored_count(&s), before);
}

#[test]
fn batch_upload_takes_200_files_and_refuses_201() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let names: Vec<String> = (0..201).map(|i| format!("dir{}/f{i}.txt", i % 7)).collect();
    let parts: Vec<Part> = names.iter().map(|n| file_part(n, "text/plain", n.as_bytes())).collect();
    let before = stored_count(&s);
    assert_error(&c.upload_batch(&parts), 400, "invalid_request");
    assert_eq!(stored_count(&s), before, "a refused batch stores nothing");
    let reply = c.upload_batch(&parts[..200]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "success", "{v}");
    assert_eq!(v["succeeded"], 200, "{v}");
    let sid = v["storage_session_id"].as_str().unwrap();
    assert_eq!(c.list_detail(sid, "").len(), 200);
    let f = &v["files"][123];
    assert_eq!(f["filename"], names[123].as_str(), "{v}");
    assert_eq!(
        c.download(sid, f["fileId"].as_str().unwrap()).body,
        names[123].as_bytes()
    );
}

#[test]
fn upload_names_keep_to_the_store() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let marker = unique(&s, "escape");
    for raw in [
        format!("../../../../../../tmp/{marker}-a.txt"),
        format!("/tmp/{marker}-b.txt"),
        format!("..\\..\\{marker}-c.txt"),
        format!("sub/../../{marker}-d.txt"),
    ] {
        let reply = c.upload_parts(&[file_part(&raw, "text/plain", b"escaped?\n")]);
        assert!(reply.status == 200 || reply.status == 400, "{raw}: {reply}");
        if reply.status == 200 {
            let v = reply.json();
            let name = v["files"][0]["name"].as_str().unwrap_or_else(|| panic!("{v}"));
            assert!(!name.starts_with('/'), "{v}");
            assert!(!name.split(['/', '\\']).any(|p| p == ".."), "{v}");
        } else {
            assert_error(&reply, 400, "invalid_request");
        }
    }
    let mut leaked: Vec<PathBuf> = Vec::new();
    let dirs: [&Path; 5] = [
        Path::new("/tmp"),
        Path::new("/"),
        s.dir.parent().unwrap_or(Path::new("/tmp")),
        s.dir.as_path(),
        s.data_dir.as_path(),
    ];
    for dir in dirs {
        if let Ok(entries) = std::fs::read_dir(dir) {
            leaked.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.to_string_lossy().contains(&marker)),
            );
        }
    }
    leaked.extend(
        regular_files(&s.data_dir)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&marker)),
    );
    assert!(leaked.is_empty(), "an upload name became a path: {leaked:?}");
}
