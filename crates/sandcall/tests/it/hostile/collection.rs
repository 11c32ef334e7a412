//! Output collection and storage quotas: sparse files cannot inflate what a run stores,
//! and a principal's stored bytes and files are bounded.

use crate::common::{hostile, Server};
use crate::files::regular_files;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// Apparent bytes (st_size) of every stored object: what the data dir holds for files,
/// whatever the filesystem does with holes.
fn object_bytes(s: &Server) -> u64 {
    regular_files(&s.data_dir.join("files/objects"))
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

fn skipped(r: &Value) -> Vec<(String, String)> {
    r["files_skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no files_skipped: {r}"))
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn output_sizes(r: &Value) -> Vec<(String, u64)> {
    r["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {r}"))
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_owned(), f["size"].as_u64().unwrap()))
        .collect()
}

#[test]
fn sparse_outputs_are_collected_only_up_to_the_workspace_limit() {
    let s = Server::start();
    let before = object_bytes(&s);
    let r = s.exec(
        json!({"code": hostile("collect_sparse_many.py"), "limits": {"workspace_limit_mb": 16}, "timeout": 60000}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    // The files really are holes: the workspace (16 MiB) could not hold 160 MiB of data.
    assert_eq!(r["stdout"], "blocks=0\n", "{r}");
    let files = output_sizes(&r);
    let total: u64 = files.iter().map(|(_, n)| n).sum();
    assert!(total <= 16 * MIB, "collected {total} bytes: {r}");
    assert_eq!(files.len(), 4, "four files of 4 MiB fit 16 MiB: {r}");
    let skips = skipped(&r);
    assert_eq!(r["files_skipped_total"], 36, "{r}");
    assert!(skips.iter().all(|(_, why)| why == "over_workspace_limit"), "{skips:?}");
    assert_eq!(
        files.len() + skips.len(),
        40,
        "every file is either collected or listed: {r}"
    );
    let grew = object_bytes(&s) - before;
    assert!(grew <= 16 * MIB + MIB, "the data dir grew by {grew} bytes");
    s.assert_healthy();
}
