//! Files as runs use them: resolving a request's input files, and storing what a run
//! produced as output files.

use super::{check_input_name, guess_type, now_ms, FileMeta, FileStore, Quota, StoreError};
use crate::error::EngineError;
use crate::error::ErrorKind;
use sandcall_api::{error_type, FileOrigin, FileRef, OutputFile, SkippedFile};
use sandcall_config::Config;
use sandcall_sandbox::protocol::{Collect, InputFile, RunResult};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Collection settings for a run whose outputs go to `outbox`. A run stores at most its
/// working directory's size (`workspace_bytes`) of outputs.
pub fn collect_into(config: &Config, outbox: &Path, workspace_bytes: u64) -> Collect {
    Collect {
        outbox: outbox.to_path_buf(),
        max_files: config.files.max_output_files,
        max_file_bytes: config.files.max_file_bytes,
        max_total_bytes: workspace_bytes,
    }
}

pub fn file_not_found() -> EngineError {
    EngineError::new(ErrorKind::NotFound, error_type::FILE_NOT_FOUND, "no such file")
}

pub fn storage_error(e: StoreError) -> EngineError {
    match e {
        StoreError::Full => EngineError::new(
            ErrorKind::InsufficientStorage,
            error_type::INSUFFICIENT_STORAGE,
            "the server's storage is full",
        ),
        StoreError::Quota(q) => EngineError::quota_exceeded(q.to_string()),
        StoreError::Unavailable(detail) => EngineError::file_store_unavailable(&detail),
        other => EngineError::internal(error_type::INTERNAL, &other.to_string()),
    }
}

/// The request's input files, checked (name, owner) and located. The total size must
/// fit the workspace.
pub async fn resolve_inputs(
    store: &dyn FileStore,
    principal: &str,
    refs: &[FileRef],
    workspace_bytes: u64,
) -> Result<Vec<InputFile>, EngineError> {
    let mut inputs = Vec::with_capacity(refs.len());
    let mut names = HashSet::new();
    let mut total = 0u64;
    for r in refs {
        check_input_name(&r.name).map_err(|e| EngineError::bad_request(e.to_string()))?;
        if !names.insert(r.name.as_str()) {
            return Err(EngineError::bad_request(format!(
                "two input files are named {:?}",
                r.name
            )));
        }
        // A file cannot also be a folder of another input.
        if let Some(other) = names
            .iter()
            .find(|n| n.starts_with(&format!("{}/", r.name)) || r.name.starts_with(&format!("{n}/")))
        {
            return Err(EngineError::bad_request(format!(
                "input files {other:?} and {:?} clash: one would be a folder of the other",
                r.name
            )));
        }
        let session = r
            .session()
            .ok_or_else(|| EngineError::bad_request(format!("input file {:?} needs its storage_session_id", r.name)))?;
        if !sandcall_api::ids::is_id(session) || !sandcall_api::ids::is_id(&r.id) {
            return Err(file_not_found());
        }
        let meta = store
            .get(principal, session, &r.id)
            .await
            .map_err(storage_error)?
            .ok_or_else(file_not_found)?;
        // tmpfs counts whole pages.
        total += meta.size.div_ceil(4096) * 4096 + 4096;
        let source = store.local_path(&meta).await.map_err(storage_error)?;
        let tag = InputTag {
            id: meta.id.clone(),
            storage_session_id: meta.session_id.clone(),
            name: r.name.clone(),
            size: meta.size,
            entity_id: r.entity_id.clone(),
        };
        inputs.push(InputFile {
            source,
            name: r.name.clone(),
            read_only: meta.read_only,
            tag: serde_json::to_string(&tag).unwrap_or_default(),
        });
    }
    if total > workspace_bytes {
        return Err(EngineError::too_large(format!(
            "the input files ({total} bytes) do not fit the working directory ({workspace_bytes} bytes)"
        )));
    }
    Ok(inputs)
}

/// What the server tells itself about an input, through the helper (`InputFile.tag`,
/// echoed back untouched): enough to list it as inherited, or to name it as the origin
/// of a changed copy.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct InputTag {
    id: String,
    storage_session_id: String,
    /// The name it was staged under.
    name: String,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entity_id: Option<String>,
}

/// The run's inputs by the tag the server gave each. The helper echoes tags back, and
/// in the gvisor tier it runs inside the gVisor sandbox, where a program that broke out
/// of its own sandbox could make it echo any text: only a tag the run was given is read,
/// from the server's own copy.
struct OwnTags<'a>(HashMap<&'a str, InputTag>);

impl<'a> OwnTags<'a> {
    fn of(inputs: &'a [InputFile]) -> Self {
        OwnTags(
            inputs
                .iter()
                .filter_map(|i| Some((i.tag.as_str(), serde_json::from_str(&i.tag).ok()?)))
                .collect(),
        )
    }

    /// Drops from `result` every tag the run was not given (naming any principal's
    /// file): an `inherited` one is not listed, an output's `input` names no origin.
    fn drop_others(&self, result: &mut RunResult) {
        let before = result.inherited.len();
        result.inherited.retain(|t| self.0.contains_key(t.as_str()));
        let mut dropped = before - result.inherited.len();
        for out in &mut result.outputs {
            if out.input.as_deref().is_some_and(|t| !self.0.contains_key(t)) {
                out.input = None;
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::warn!(dropped, "the helper echoed tags that were not the run's inputs'");
        }
    }

    fn get(&self, tag: &str) -> Option<&InputTag> {
        self.0.get(tag)
    }
}

/// The inputs (by the name they were staged under) that a run deleted: staged, and
/// neither reported as they were, nor collected changed, nor skipped by the collection.
fn deleted_inputs(inputs: &[InputFile], own: &OwnTags, result: &RunResult) -> Vec<String> {
    let mut kept: HashSet<&str> = result
        .inherited
        .iter()
        .chain(result.outputs.iter().filter_map(|o| o.input.as_ref()))
        .filter_map(|t| own.get(t))
        .map(|t| t.name.as_str())
        .collect();
    kept.extend(result.skipped.iter().map(|s| s.name.as_str()));
    inputs
        .iter()
        .filter(|i| !i.read_only && !kept.contains(i.name.as_str()))
        .map(|i| i.name.clone())
        .collect()
}

/// What `ingest` made of a run's outputs.
#[derive(Default)]
pub struct Ingested {
    pub files: Vec<OutputFile>,
    pub skipped: Vec<SkippedFile>,
    pub skipped_total: usize,
    /// Output files newly stored.
    pub delivered: usize,
    /// Output files collected (or found) that could not be stored: counted in
    /// `skipped_total` too.
    pub undelivered: usize,
    /// The inputs the run deleted, by the name they were staged under.
    pub deleted: Vec<String>,
}

/// Moves what the helper collected into the store under the run's session, and lists
/// it for the response, with the run's `inputs` it left as they were and those it
/// deleted. A file the principal's quota has no room for is skipped as
/// `quota_exceeded`. The outbox is removed afterwards, whatever happened.
pub async fn ingest(
    store: &dyn FileStore,
    principal: &str,
    session_id: &str,
    config: &Config,
    inputs: &[InputFile],
    outbox: &Path,
    result: &mut RunResult,
) -> Ingested {
    let own = OwnTags::of(inputs);
    own.drop_others(result);
    let deleted = deleted_inputs(inputs, &own, result);
    let mut files = Vec::with_capacity(result.outputs.len());
    let mut skipped: Vec<SkippedFile> = result
        .skipped
        .drain(..)
        .map(|s| SkippedFile {
            name: s.name,
            reason: s.reason,
        })
        .collect();
    let mut skipped_total = result.skipped_total;
    // The helper could not write to the outbox: those are undelivered too.
    let mut undelivered = skipped.iter().filter(|s| s.reason == "storage_full").count();
    let mut delivered = 0;
    let created = now_ms();
    let quota = Quota::of(config);
    // The inputs the run left as they were (and the read-only ones) come back under
    // their own id and storage session: nothing new is stored for them.
    for tag in result.inherited.drain(..) {
        if let Some(t) = own.get(&tag).cloned() {
            files.push(OutputFile {
                id: t.id,
                name: t.name,
                storage_session_id: t.storage_session_id,
                size: t.size,
                inherited: Some(true),
                entity_id: t.entity_id,
                modified_from: None,
            });
        }
    }
    for mut out in result.outputs.drain(..) {
        // The helper says where it put each file. In the gvisor tier it runs inside the
        // gVisor sandbox, where a program that broke out of its own sandbox could make it
        // name any host path: only a regular file right in this run's outbox is taken,
        // at the size the host sees.
        let Some(size) = outbox_file_size(outbox, &out.path) else {
            tracing::warn!(path = %out.path.display(), "an output outside the run's outbox, or not a regular file");
            skipped_total += 1;
            undelivered += 1;
            if skipped.len() < 100 {
                skipped.push(SkippedFile {
                    name: out.name,
                    reason: "unreadable".into(),
                });
            }
            continue;
        };
        out.size = size;
        let meta = FileMeta {
            principal: principal.to_owned(),
            session_id: session_id.to_owned(),
            id: sandcall_api::ids::new_id(),
            content_type: guess_type(&out.name),
            name: out.name,
            size: out.size,
            sha256: out.sha256,
            created_ms: created,
            expires_ms: created + config.files.file_ttl_s * 1000,
            kind: None,
            entity_id: None,
            version: None,
            read_only: false,
        };
        let entry = OutputFile {
            id: meta.id.clone(),
            name: meta.name.clone(),
            storage_session_id: session_id.to_owned(),
            size: meta.size,
            inherited: None,
            entity_id: None,
            // A changed input is a new file that names the one it was staged from.
            modified_from: out.input.as_deref().and_then(|t| own.get(t)).map(|t| FileOrigin {
                id: t.id.clone(),
                storage_session_id: t.storage_session_id.clone(),
            }),
        };
        let name = meta.name.clone();
        let size = meta.size;
        match store.insert(meta, &out.path, quota).await {
            Ok(()) => {
                crate::telemetry::stored(1, size);
                delivered += 1;
                files.push(entry)
            }
            Err(e) => {
                let reason = match e {
                    StoreError::Full => "storage_full",
                    StoreError::Quota(_) => "quota_exceeded",
                    StoreError::Unavailable(detail) => {
                        tracing::error!(%detail, "storing an output file");
                        "storage_unavailable"
                    }
                    other => {
                        tracing::error!(detail = %other, "storing an output file");
                        "storage_error"
                    }
                };
                skipped_total += 1;
                undelivered += 1;
                if skipped.len() < 100 {
                    skipped.push(SkippedFile {
                        name,
                        reason: reason.into(),
                    });
                }
            }
        }
    }
    // Made by the helper for the first file it saw, even one it then dropped. Most runs
    // have none: a look-up of a local directory entry is cheaper than a trip to a
    // blocking thread.
    if outbox.symlink_metadata().is_ok() {
        let _ = tokio::fs::remove_dir_all(outbox).await;
    }
    Ingested {
        files,
        skipped,
        skipped_total,
        delivered,
        undelivered,
        deleted,
    }
}

/// The size of `path` if it is a regular file (not a link to one) directly in `outbox`.
fn outbox_file_size(outbox: &Path, path: &Path) -> Option<u64> {
    if path.parent() != Some(outbox) || path.file_name().is_none() {
        return None;
    }
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type().is_file().then_some(meta.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcall_sandbox::protocol::CollectedFile;

    /// A helper that names a host path outside the outbox as an output (a gVisor
    /// sandbox's, made to by a program that broke out of its own sandbox) gets nothing
    /// stored, and the file stays where it is.
    #[tokio::test]
    async fn an_output_named_outside_the_outbox_is_skipped_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("sandcall-ingest-test-{}", sandcall_api::ids::new_id()));
        let outbox = dir.join("outbox");
        std::fs::create_dir_all(&outbox).unwrap();
        let secret = dir.join("token.key");
        std::fs::write(&secret, "secret").unwrap();
        std::fs::write(outbox.join("0"), "chart").unwrap();
        let output = |name: &str, path: &Path| CollectedFile {
            name: name.into(),
            size: 5,
            sha256: String::new(),
            path: path.to_path_buf(),
            input: None,
        };
        let mut result = RunResult {
            outputs: vec![output("chart.png", &outbox.join("0")), output("stolen", &secret)],
            ..Default::default()
        };
        let store = sandcall_store::memory::MemoryFileStore::new(dir.join("files"));
        let got = ingest(&store, "p", "s", &Config::default(), &[], &outbox, &mut result).await;
        let names: Vec<&str> = got.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["chart.png"]);
        assert_eq!(
            got.skipped
                .iter()
                .map(|s| (s.name.as_str(), s.reason.as_str()))
                .collect::<Vec<_>>(),
            [("stolen", "unreadable")]
        );
        assert_eq!((got.delivered, got.undelivered), (1, 1));
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_regular_file_right_in_the_outbox_is_an_output() {
        let dir = std::env::temp_dir().join(format!("sandcall-outbox-test-{}", sandcall_api::ids::new_id()));
        let outbox = dir.join("outbox");
        std::fs::create_dir_all(outbox.join("sub")).unwrap();
        let secret = dir.join("token.key");
        std::fs::write(&secret, "secret").unwrap();
        std::fs::write(outbox.join("0"), "four").unwrap();
        std::fs::write(outbox.join("sub/1"), "x").unwrap();
        std::os::unix::fs::symlink(&secret, outbox.join("2")).unwrap();
        assert_eq!(outbox_file_size(&outbox, &outbox.join("0")), Some(4));
        for refused in [
            secret.clone(),
            outbox.join("sub/1"),
            outbox.join("2"),
            outbox.join("sub"),
            outbox.join("../token.key"),
            outbox.join("missing"),
        ] {
            assert_eq!(outbox_file_size(&outbox, &refused), None, "{}", refused.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn input(name: &str, read_only: bool) -> InputFile {
        let tag = InputTag {
            id: format!("id-{name}"),
            storage_session_id: "s".into(),
            name: name.into(),
            size: 1,
            entity_id: None,
        };
        InputFile {
            source: "/nowhere".into(),
            name: name.into(),
            read_only,
            tag: serde_json::to_string(&tag).unwrap(),
        }
    }

    #[test]
    fn deleted_inputs_are_those_neither_kept_changed_nor_skipped() {
        let inputs = [
            input("kept", false),
            input("changed", false),
            input("skipped", false),
            input("gone", false),
            input("dir/gone too", false),
            input("read-only", true),
        ];
        let result = RunResult {
            inherited: vec![inputs[0].tag.clone(), inputs[5].tag.clone()],
            outputs: vec![CollectedFile {
                name: "changed".into(),
                size: 1,
                sha256: String::new(),
                path: "/nowhere".into(),
                input: Some(inputs[1].tag.clone()),
            }],
            skipped: vec![sandcall_sandbox::protocol::SkippedFile {
                name: "skipped".into(),
                reason: "too_large".into(),
            }],
            ..Default::default()
        };
        let own = OwnTags::of(&inputs);
        assert_eq!(deleted_inputs(&inputs, &own, &result), ["gone", "dir/gone too"]);
        // A run that emptied the working directory: every input but the read-only one.
        let emptied = RunResult {
            inherited: vec![inputs[5].tag.clone()],
            ..Default::default()
        };
        assert_eq!(deleted_inputs(&inputs, &own, &emptied).len(), 5);
    }

    /// A helper that echoes a tag the run was not given (a gVisor sandbox's, made to by
    /// a program that broke out of its own sandbox), naming another principal's file as
    /// inherited or as the origin of an output, gets neither listed.
    #[tokio::test]
    async fn only_the_runs_own_input_tags_are_read_back() {
        let dir = std::env::temp_dir().join(format!("sandcall-tags-test-{}", sandcall_api::ids::new_id()));
        let outbox = dir.join("outbox");
        std::fs::create_dir_all(&outbox).unwrap();
        std::fs::write(outbox.join("0"), "new").unwrap();
        let inputs = [input("mine", false), input("gone", false)];
        let mut forged = input("gone", false);
        forged.tag = forged.tag.replace("id-gone", "another-principals-file");
        let mut result = RunResult {
            inherited: vec![inputs[0].tag.clone(), forged.tag.clone()],
            outputs: vec![CollectedFile {
                name: "report.txt".into(),
                size: 3,
                sha256: String::new(),
                path: outbox.join("0"),
                input: Some(forged.tag.clone()),
            }],
            ..Default::default()
        };
        let store = sandcall_store::memory::MemoryFileStore::new(dir.join("files"));
        let got = ingest(&store, "p", "s", &Config::default(), &inputs, &outbox, &mut result).await;
        let listed: Vec<(&str, &str, Option<bool>)> = got
            .files
            .iter()
            .map(|f| (f.id.as_str(), f.name.as_str(), f.inherited))
            .collect();
        assert_eq!(listed[0], ("id-mine", "mine", Some(true)));
        assert_eq!((listed.len(), listed[1].1, listed[1].2), (2, "report.txt", None));
        assert!(got.files[1].modified_from.is_none());
        // The forged tag names "gone" too: it is deleted all the same.
        assert_eq!(got.deleted, ["gone"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
