//! Collection of what a run wrote, and every trick a hostile program can play on it:
//! links, fifos, devices, odd names, swaps, floods, sparse files, deep folders. Each
//! trick has a fixture in `tests/hostile/collect_*`.

use super::client::Client;
use super::support::{
    assert_no_secrets, assert_outputs_shape, download_output, host_secrets, output, output_names, pairs, peak_rss_kib,
    regular_files, run_fixture, session_of, skipped, skipped_for, src, stored_count, strings, unique,
    wait_for_stored_count,
};
use crate::common::{descendants, Server, NO_POOL};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn bash_outputs_in_sub_folders() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let r = c.exec(json!({
        "language": "bash",
        "code": src(&[
            "mkdir -p out/deep/er empty_dir",
            "echo hi > out/a.txt",
            "printf 'x' > b.bin",
            "seq 1 1000 > out/deep/er/numbers.txt",
            "echo scratch > /tmp/not_collected.txt",
        ]),
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_outputs_shape(&r);
    assert_eq!(
        output_names(&r),
        strings(&["b.bin", "out/a.txt", "out/deep/er/numbers.txt"]),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "out/a.txt"), b"hi\n");
    assert_eq!(download_output(&c, &r, "b.bin"), b"x");
    let numbers: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    assert_eq!(download_output(&c, &r, "out/deep/er/numbers.txt"), numbers.as_bytes());
    assert_eq!(output(&r, "out/deep/er/numbers.txt")["size"], numbers.len());
    // A run that writes nothing lists nothing.
    let r = c.exec(json!({"language": "bash", "code": "echo quiet"}));
    assert_eq!(r["files"], json!([]), "{r}");
}

#[test]
fn folders_nested_too_deep_are_not_walked() {
    let s = Server::start();
    let r = s.py("import os\nfor i in range(100):\n    os.mkdir('d')\n    os.chdir('d')\nopen('deep.txt', 'w').write('x')\nos.chdir('/mnt/data')\nopen('top.txt', 'w').write('y')");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), vec!["top.txt".to_string()], "{r}");
    let skipped = r["files_skipped"].as_array().unwrap();
    assert!(skipped.iter().any(|e| e["reason"] == "too_deep"), "{r}");
    s.assert_healthy();
}

#[test]
fn symlinks_pointing_outside_are_never_followed() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let input = c.upload("input.csv", "text/csv", b"a,b\n");
    let secrets = host_secrets(&s);
    assert!(
        secrets.iter().any(|(w, _)| w == "/etc/passwd"),
        "the host has no /etc/passwd to protect"
    );
    let stored = stored_count(&s);
    let (r, took) = run_fixture(
        &s,
        "bash",
        "collect_symlinks.sh",
        json!([s.data_dir.to_string_lossy()]),
        json!([input.input("input.csv")]),
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "done\n", "{r}");
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    assert_eq!(
        skipped_for(&r, "symlink"),
        strings(&[
            "data_dir",
            "etc",
            "input.csv",
            "nested/passwd",
            "passwd",
            "proc_root_passwd",
            "relative_passwd",
            "root",
            "self_loop",
            "shadow",
            "stored_files",
            "token_key",
        ]),
        "{r}"
    );
    assert_eq!(skipped(&r).len(), 12, "{r}");
    assert_eq!(r["files_skipped_total"], 12, "{r}");
    let ok = download_output(&c, &r, "ok.txt");
    assert_eq!(ok, b"fine\n");
    wait_for_stored_count(&s, stored + 1, Duration::from_secs(5));
    assert_no_secrets(&s, &secrets, &[ok]);
    // The input replaced by a link is untouched in the store.
    assert_eq!(c.download(&input.session_id, &input.id).body, b"a,b\n");
    s.assert_healthy();
}

#[test]
fn hard_links_are_collected_once() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    let stored = stored_count(&s);
    let (r, _) = run_fixture(&s, "bash", "collect_hard_links.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(!out.contains("shadow=0"), "a hard link to /etc/shadow was made: {r}");
    assert!(!out.contains("passwd=0"), "a hard link to /etc/passwd was made: {r}");
    assert_eq!(output_names(&r), strings(&["a.txt", "solo.txt"]), "{r}");
    assert_eq!(skipped_for(&r, "hard_link"), strings(&["b.txt", "sub/c.txt"]), "{r}");
    assert_eq!(skipped(&r).len(), 2, "{r}");
    assert_eq!(r["files_skipped_total"], 2, "{r}");
    let a = download_output(&c, &r, "a.txt");
    assert_eq!(a, b"shared\n");
    assert_eq!(download_output(&c, &r, "solo.txt"), b"solo\n");
    wait_for_stored_count(&s, stored + 2, Duration::from_secs(5));
    assert_no_secrets(&s, &secrets, &[a]);
}

#[test]
fn fifos_and_sockets_are_skipped_without_hanging() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let input = c.upload("input.txt", "text/plain", b"in\n");
    let (r, took) = run_fixture(
        &s,
        "python",
        "collect_fifos.py",
        json!([]),
        json!([input.input("input.txt")]),
    );
    assert!(took < Duration::from_secs(20), "collection hung on a fifo: {took:?}");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    let mut expected = vec!["input.txt", "pipe", "sub/pipe"];
    if r["stdout"].as_str().unwrap().contains("socket made") {
        expected.push("sock");
    }
    expected.sort_unstable();
    assert_eq!(skipped_for(&r, "not_regular_file"), strings(&expected), "{r}");
    assert_eq!(skipped(&r).len(), expected.len(), "{r}");
    assert_eq!(download_output(&c, &r, "ok.txt"), b"fine\n");
    assert_eq!(c.download(&input.session_id, &input.id).body, b"in\n");
    s.assert_healthy();
}

#[test]
fn device_nodes_cannot_be_made_or_collected() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let (r, took) = run_fixture(&s, "python", "collect_devices.py", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    assert_eq!(r["status"], "ok", "{r}");
    let results: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {r}"));
    for name in ["char_null", "char_zero", "char_mem", "block_sda"] {
        assert!(results[name].is_u64(), "mknod {name} was not refused: {results}");
    }
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    assert_eq!(
        skipped_for(&r, "symlink"),
        strings(&["mem_link", "urandom_link", "zero_link"]),
        "{r}"
    );
    if results["null_hard"] == "created" {
        // Linked in after all: it must still never be read.
        assert_eq!(skipped_for(&r, "not_regular_file"), strings(&["null_hard"]), "{r}");
    } else {
        assert_eq!(skipped(&r).len(), 3, "{r}");
    }
    for (name, _) in skipped(&r) {
        assert!(!name.starts_with("char_") && !name.starts_with("block_"), "{r}");
    }
    assert_eq!(download_output(&c, &r, "ok.txt"), b"fine\n");
    s.assert_healthy();
}

#[test]
fn names_with_dots_are_plain_names_and_nothing_escapes() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let marker = unique(&s, "dots");
    let (r, _) = run_fixture(&s, "bash", "collect_dot_names.sh", json!([marker]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        output_names(&r),
        strings(&["...", "..dir/file", "a..b", "b..", "sub/..."]),
        "{r}"
    );
    assert_eq!(r["files_skipped"], json!([]), "{r}");
    for (name, body) in [
        ("...", &b"three\n"[..]),
        ("..dir/file", &b"inside\n"[..]),
        ("a..b", &b"ab\n"[..]),
        ("b..", &b"tail\n"[..]),
        ("sub/...", &b"deep\n"[..]),
    ] {
        assert_eq!(download_output(&c, &r, name), body, "{name}");
    }
    // Nothing named after the marker exists on the host.
    let escaped = format!("escape-{marker}");
    for dir in [Path::new("/"), Path::new("/mnt"), Path::new("/tmp"), s.dir.as_path()] {
        assert!(!dir.join(&escaped).exists(), "{} exists", dir.join(&escaped).display());
    }
    let found: Vec<PathBuf> = regular_files(&s.dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&marker))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn names_with_newlines_or_invalid_utf8_are_skipped() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let (r, _) = run_fixture(&s, "python", "collect_bad_names.py", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "made\n", "{r}");
    assert_eq!(
        output_names(&r),
        strings(&["caf\u{e9} \u{2713}.txt", "good.txt"]),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "caf\u{e9} \u{2713}.txt"), b"unicode\n");
    assert_eq!(download_output(&c, &r, "good.txt"), b"good\n");
    let bad = skipped(&r);
    assert!(bad.iter().all(|(_, why)| why == "invalid_name"), "{r}");
    assert_eq!(bad.len(), 6, "{r}");
    assert_eq!(r["files_skipped_total"], 6, "{r}");
    let names: Vec<&str> = bad.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"bad\u{fffd}name.txt"), "{r}");
    for (start, end) in [
        ("new", "line.txt"),
        ("carriage", "return.txt"),
        ("escape", ".txt"),
        ("tab", "name.txt"),
        ("dir\u{fffd}", ""),
    ] {
        assert_eq!(
            names
                .iter()
                .filter(|n| n.starts_with(start) && n.ends_with(end))
                .count(),
            1,
            "no single entry for {start}...{end}: {r}"
        );
    }
    wait_for_stored_count(&s, stored + 2, Duration::from_secs(5));
    // Listing the run's session shows only the good names.
    let mut listed: Vec<String> = c
        .list(&session_of(&r))
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, strings(&["caf\u{e9} \u{2713}.txt", "good.txt"]));
}

#[test]
fn directory_swapped_for_a_symlink_at_the_end() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    let (r, _) = run_fixture(&s, "bash", "collect_dir_swap.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "swapping\n", "{r}");
    assert_eq!(output_names(&r), strings(&["moved/hostname", "moved/passwd"]), "{r}");
    assert_eq!(skipped(&r), pairs(&[("out", "symlink")]), "{r}");
    let mut bodies = Vec::new();
    for name in ["moved/hostname", "moved/passwd"] {
        let body = download_output(&c, &r, name);
        assert_eq!(body, b"decoy\n", "{name}");
        bodies.push(body);
    }
    assert_no_secrets(&s, &secrets, &bodies);
}

#[test]
fn swapping_during_collection_reads_nothing_outside() {
    let s = Server::start_with(&[NO_POOL], "");
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    for round in 0..3 {
        let (r, took) = run_fixture(&s, "python", "collect_swap_race.py", json!([]), json!([]));
        assert!(took < Duration::from_secs(30), "round {round} took {took:?}: {r}");
        assert_eq!(r["status"], "ok", "round {round}: {r}");
        assert!(
            r["stdout"].as_str().unwrap().contains("leaving the swapper running"),
            "{r}"
        );
        let mut allowed = vec!["file_swap".to_owned(), "file_link".to_owned(), "tmp_swap".to_owned()];
        for dir in ["out", "swap", "tmp_swap"] {
            for name in ["passwd", "group", "hostname"] {
                allowed.push(format!("{dir}/{name}"));
            }
        }
        let mut bodies = Vec::new();
        for name in output_names(&r) {
            assert!(
                allowed.contains(&name),
                "round {round}: collected {name:?}, not a decoy: {r}"
            );
            let body = download_output(&c, &r, &name);
            assert_eq!(body, b"decoy\n", "round {round}: {name} is not the decoy");
            bodies.push(body);
        }
        assert!(output_names(&r).len() <= 4, "round {round}: {r}");
        for (name, why) in skipped(&r) {
            assert!(
                allowed.contains(&name) || ["out", "swap"].contains(&name.as_str()),
                "round {round}: {name}: {r}"
            );
            assert!(
                why == "symlink" || why == "not_regular_file",
                "round {round}: {name} {why}: {r}"
            );
        }
        assert_no_secrets(&s, &secrets, &bodies);
    }
    // The swapper died with its run.
    let t = Instant::now();
    while !descendants(s.pid()).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "left behind: {:?}",
            descendants(s.pid())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.assert_healthy();
}

#[test]
fn ten_thousand_tiny_files() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let (r, took) = run_fixture(&s, "bash", "collect_many_files.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "created 10000\n", "{}", r["stderr"]);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let names = output_names(&r);
    let expected: Vec<String> = (0..100).map(|i| format!("f{i:04}")).collect();
    assert_eq!(names, expected, "the first 100 in sorted order");
    let skipped = skipped(&r);
    assert_eq!(skipped.len(), 100, "files_skipped lists at most 100 entries");
    assert!(
        skipped
            .iter()
            .all(|(n, why)| why == "too_many_files" && !names.contains(n)),
        "{r}"
    );
    assert_eq!(r["files_skipped_total"], 9900, "{}", r["files_skipped_total"]);
    assert_eq!(download_output(&c, &r, "f0042"), b"0042");
    wait_for_stored_count(&s, stored + 100, Duration::from_secs(10));
    assert_eq!(c.list(&session_of(&r)).len(), 100);
}

#[test]
fn two_gib_sparse_file_is_never_read() {
    // The file size limit is raised so that the sparse file can exist at all.
    let s = Server::start_with(&[("SANDCALL_FILE_SIZE_LIMIT_MB", "4096")], "");
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let before = peak_rss_kib(s.pid());
    let (r, took) = run_fixture(&s, "bash", "collect_sparse_file.sh", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("truncate=0") && out.contains("size=2147483648"),
        "the sparse file was not made: {r}"
    );
    assert_eq!(output_names(&r), strings(&["small.txt"]), "{r}");
    assert_eq!(skipped(&r), pairs(&[("big.bin", "too_large")]), "{r}");
    assert_eq!(download_output(&c, &r, "small.txt"), b"small\n");
    wait_for_stored_count(&s, stored + 1, Duration::from_secs(5));
    for path in regular_files(&s.data_dir) {
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        assert!(len < 100 << 20, "{} holds {len} bytes", path.display());
    }
    let grew = peak_rss_kib(s.pid()).saturating_sub(before);
    assert!(grew < 256 << 10, "the server's peak memory grew by {grew} KiB");

    // At the default file size limit (256 MiB) the file cannot even be made: truncate
    // dies with SIGXFSZ, leaving at most an empty big.bin, which is an ordinary output.
    drop(s);
    let s = Server::start();
    let (r, took) = run_fixture(&s, "bash", "collect_sparse_file.sh", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    for f in r["files"].as_array().unwrap() {
        assert!(
            f["name"] == "small.txt" || (f["name"] == "big.bin" && f["size"] == 0),
            "{r}"
        );
    }
    assert!(output_names(&r).contains(&"small.txt".to_string()), "{r}");
    for (name, why) in skipped(&r) {
        assert_eq!((name.as_str(), why.as_str()), ("big.bin", "too_large"), "{r}");
    }
}
