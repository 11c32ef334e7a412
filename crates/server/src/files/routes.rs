//! The file routes: upload, download, list, metadata, delete. Every lookup is by the
//! caller's principal: another principal's file is "not found".

use super::ops::{file_not_found, storage_error};
use super::{guess_type, now_ms, object_name, rfc3339, upload_name, FileMeta, FileStore, Quota, QuotaExceeded, Usage};
use crate::config::Config;
use crate::error::ApiError;
use crate::extract::ApiPath;
use crate::AppState;
use axum::body::Body;
use axum::extract::multipart::{Multipart, MultipartRejection};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use sandcall_api::ids;
use sandcall_api::{
    BatchFileResult, BatchUploadResponse, DeleteFileResponse, ErrorBody, FileFull, FileNormalized, FileObjectMetadata,
    FileSummary, ObjectInfo, UploadResponse, UploadedFile,
};
use sandcall_auth::Principal;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// File parts per upload request.
const MAX_PARTS: usize = 100;
/// File parts per batch upload request.
pub const MAX_BATCH_PARTS: usize = 200;
/// The longest value of a form field (`kind`, `id`, `version`, `read_only`).
const MAX_FIELD_BYTES: usize = 1024;

/// The body limit of an upload: every part at its largest, and the multipart framing.
/// Each part is capped on its own while it streams to disk.
pub fn upload_limit(config: &Config) -> usize {
    (config.files.max_file_bytes as usize)
        .saturating_mul(MAX_PARTS)
        .saturating_add(1 << 20)
}

/// The body limit of a batch upload, as `upload_limit` for `MAX_BATCH_PARTS` parts.
pub fn batch_upload_limit(config: &Config) -> usize {
    (config.files.max_file_bytes as usize)
        .saturating_mul(MAX_BATCH_PARTS)
        .saturating_add(1 << 20)
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> ApiError {
    if crate::extract::body_timed_out(&e) {
        crate::extract::request_timeout()
    } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large("the upload is larger than the server accepts")
    } else {
        ApiError::bad_request(format!("malformed multipart body: {}", e.body_text()))
    }
}

fn not_multipart(e: MultipartRejection) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        sandcall_api::error_type::UNSUPPORTED_MEDIA_TYPE,
        format!("expected a multipart/form-data body: {}", e.body_text()),
    )
}

/// The form fields an upload may carry beside its files; they apply to every file of
/// the request, wherever they stand among the parts.
#[derive(Debug, Default, Clone)]
struct UploadFields {
    kind: Option<String>,
    entity_id: Option<String>,
    version: Option<String>,
    read_only: bool,
    /// The fields taken so far, by the name they are stored under: each may come once.
    seen: Vec<&'static str>,
}

impl UploadFields {
    /// Takes one non-file field; other names are ignored. A field sent twice is refused,
    /// since which of its values applies would be a guess.
    async fn take(&mut self, name: &str, field: &mut axum::extract::multipart::Field<'_>) -> Result<(), ApiError> {
        let canonical = match name {
            "kind" => "kind",
            "id" | "entity_id" => "id",
            "version" => "version",
            "read_only" => "read_only",
            _ => return Ok(()),
        };
        if self.seen.contains(&canonical) {
            return Err(ApiError::bad_request(format!(
                "the `{canonical}` field is given more than once{}",
                if canonical == "id" {
                    " (`entity_id` is the same field)"
                } else {
                    ""
                }
            )));
        }
        self.seen.push(canonical);
        let slot = match name {
            "kind" => &mut self.kind,
            // `entity_id` is what older LibreChat versions send.
            "id" | "entity_id" => &mut self.entity_id,
            "version" => &mut self.version,
            "read_only" => {
                let value = field_text(name, field).await?;
                self.read_only = match value.as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "`read_only` must be `true` or `false` (or `1`, `0`), not {value:?}"
                        )))
                    }
                };
                return Ok(());
            }
            _ => return Ok(()),
        };
        let value = field_text(name, field).await?;
        *slot = Some(value).filter(|v| !v.is_empty());
        Ok(())
    }
}

/// A form field's value, at most `MAX_FIELD_BYTES` of UTF-8 without control characters.
async fn field_text(name: &str, field: &mut axum::extract::multipart::Field<'_>) -> Result<String, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        if bytes.len() + chunk.len() > MAX_FIELD_BYTES {
            return Err(ApiError::bad_request(format!(
                "the `{name}` field is longer than {MAX_FIELD_BYTES} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    match String::from_utf8(bytes) {
        Ok(s) if !s.chars().any(char::is_control) => Ok(s),
        _ => Err(ApiError::bad_request(format!(
            "the `{name}` field must be UTF-8 text without control characters"
        ))),
    }
}

/// A file part received into `incoming/`, not yet in the store.
struct Received {
    id: String,
    name: String,
    size: u64,
    content_type: String,
    sha256: String,
    /// Removes the bytes if they never reach the store.
    _temp: PartialUpload,
}

/// What became of one file part.
enum PartOutcome {
    Received(Received),
    /// The part was refused on its own (its bytes were read and dropped): the name as
    /// sent and the reason.
    Refused(String, ApiError),
}

/// Streams one file part to `incoming/`, checking its name, `max_file_bytes` and the
/// room left in the caller's quota as the bytes arrive. A refusal of the part alone
/// (name, size, quota) is `Refused`, after the rest of the part is read when `go_on` (a
/// batch goes on to the next part; a plain upload answers at once); an error of the
/// request (malformed or timed-out body, the disk) is `Err`.
async fn receive_part(
    state: &AppState,
    field: &mut axum::extract::multipart::Field<'_>,
    room: &mut Room,
    go_on: bool,
) -> Result<PartOutcome, ApiError> {
    let refuse = |field, name, e| refuse(field, name, e, go_on);
    let raw_name = field.file_name().unwrap_or("file").to_owned();
    let name = match upload_name(&raw_name) {
        Ok(name) => name,
        Err(e) => return refuse(field, raw_name, ApiError::bad_request(e.to_string())).await,
    };
    let content_type = field
        .content_type()
        .filter(|c| !c.is_empty() && *c != "application/octet-stream")
        .map(str::to_owned)
        .unwrap_or_else(|| guess_type(&name));
    if let Err(e) = room.check(&*state.files, 0).await {
        return refuse(field, name, e).await;
    }
    let max = state.config.files.max_file_bytes;
    let id = ids::new_id();
    let temp = state.files.incoming_dir().join(&id);
    // A client that goes away mid-upload drops this future; the half-received file goes
    // with it.
    let guard = PartialUpload(temp.clone());
    let mut out = tokio::fs::File::create(&temp)
        .await
        .map_err(|e| storage_error(e.into()))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        size += chunk.len() as u64;
        if size > max {
            drop(out);
            drop(guard);
            let e = ApiError::too_large(format!("{name} is larger than {max} bytes (max_file_bytes)"));
            return refuse(field, name, e).await;
        }
        // Stop at once a part that cannot fit, rather than at `insert`.
        if let Err(e) = room.check(&*state.files, size).await {
            drop(out);
            drop(guard);
            return refuse(field, name, e).await;
        }
        hasher.update(&chunk);
        out.write_all(&chunk).await.map_err(|e| storage_error(e.into()))?;
    }
    out.flush().await.map_err(|e| storage_error(e.into()))?;
    drop(out);
    room.stored(size);
    Ok(PartOutcome::Received(Received {
        id,
        name,
        size,
        content_type,
        sha256: hasher.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        _temp: guard,
    }))
}

/// Says why a part is refused, after reading the rest of it when `go_on` (the next part
/// starts after it).
async fn refuse(
    field: &mut axum::extract::multipart::Field<'_>,
    name: String,
    e: ApiError,
    go_on: bool,
) -> Result<PartOutcome, ApiError> {
    if go_on {
        while field.chunk().await.map_err(multipart_error)?.is_some() {}
    }
    Ok(PartOutcome::Refused(name, e))
}

impl Received {
    /// The file's record; every file of one request has the same `created`.
    fn meta(
        &self,
        principal: &Principal,
        session_id: &str,
        fields: &UploadFields,
        config: &Config,
        created: u64,
    ) -> FileMeta {
        FileMeta {
            principal: principal.0.clone(),
            session_id: session_id.to_owned(),
            id: self.id.clone(),
            name: self.name.clone(),
            size: self.size,
            content_type: self.content_type.clone(),
            sha256: self.sha256.clone(),
            created_ms: created,
            expires_ms: created + config.files.file_ttl_s * 1000,
            kind: fields.kind.clone(),
            entity_id: fields.entity_id.clone(),
            version: fields.version.clone(),
            read_only: fields.read_only,
        }
    }
}

/// POST /v1/upload: each part named `file` or `files` is streamed to disk, the size cap
/// checked as the bytes arrive; the fields `kind`, `id`, `version` and `read_only` are
/// stored with every file. All or nothing.
#[utoipa::path(
    post,
    path = "/v1/upload",
    operation_id = "upload_files",
    tag = "files",
    request_body(content = crate::openapi::UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "Every file was stored, under one new `storage_session_id`.", body = UploadResponse),
        (status = 400, description = "`invalid_request`: no file part, more than 100, a name against the rules, a bad field, or a malformed body.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: a file over `max_file_bytes`, or the body over its limit.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `multipart/form-data`.", body = ErrorBody),
        (status = 507, description = "`quota_exceeded`: the files would take the caller over its quota of stored bytes or files (nothing is stored); `insufficient_storage`: the server's disk is full.", body = ErrorBody),
    ),
)]
pub async fn upload(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<UploadResponse>, ApiError> {
    let mut multipart = multipart.map_err(not_multipart)?;
    let session_id = ids::new_id();
    let quota = Quota::of(&state.config);
    let mut fields = UploadFields::default();
    let mut received: Vec<Received> = Vec::new();
    let result: Result<(), ApiError> = async {
        // A caller already at its quota is refused before any byte is read.
        let mut room = Room::open(&*state.files, &principal.0, quota).await?;
        while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
            let name = field.name().unwrap_or("").to_owned();
            if !matches!(name.as_str(), "file" | "files") {
                fields.take(&name, &mut field).await?;
                continue;
            }
            if received.len() >= MAX_PARTS {
                return Err(ApiError::bad_request(format!("at most {MAX_PARTS} files per upload")));
            }
            match receive_part(&state, &mut field, &mut room, false).await? {
                PartOutcome::Received(r) => received.push(r),
                PartOutcome::Refused(_, e) => return Err(e),
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        // All or nothing: the received parts are dropped with their temporary files.
        drop(received);
        if matches!(
            e.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::INSUFFICIENT_STORAGE
        ) {
            drain(&mut multipart).await;
        }
        return Err(e);
    }
    if received.is_empty() {
        return Err(ApiError::bad_request(
            "no file part: send the file in a part named `file`",
        ));
    }
    let mut stored: Vec<FileMeta> = Vec::with_capacity(received.len());
    let created = now_ms();
    for r in &received {
        let meta = r.meta(&principal, &session_id, &fields, &state.config, created);
        let temp = state.files.incoming_dir().join(&r.id);
        if let Err(e) = state.files.insert(meta.clone(), &temp, quota).await {
            for meta in &stored {
                let _ = state.files.delete(&meta.principal, &meta.session_id, &meta.id).await;
            }
            return Err(storage_error(e).into());
        }
        crate::telemetry::stored(1, meta.size);
        stored.push(meta);
    }
    let files = stored
        .into_iter()
        .map(|m| UploadedFile {
            file_id: m.id.clone(),
            id: m.id,
            filename: m.name.clone(),
            name: m.name,
            storage_session_id: m.session_id,
            size: m.size,
            content_type: m.content_type,
        })
        .collect();
    Ok(Json(UploadResponse {
        message: "success".into(),
        storage_session_id: session_id,
        files,
    }))
}

/// POST /v1/upload/batch: up to 200 file parts, each stored or refused on its own
/// (name, size, quota), all under one new `storage_session_id`.
#[utoipa::path(
    post,
    path = "/v1/upload/batch",
    operation_id = "upload_batch",
    tag = "files",
    request_body(content = crate::openapi::BatchUploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "At least one file was stored: `message` is `success`, or `partial_success` with the refused files marked `error`.", body = BatchUploadResponse),
        (status = 400, description = "Every file failed: the same body with `message: \"error\"`, plus `error` and `error_type` (`invalid_request`). Also the plain error body for no file part, more than 200, a bad field, or a malformed body.", body = BatchUploadResponse),
        (status = 413, description = "`payload_too_large`: the body over its limit.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `multipart/form-data`.", body = ErrorBody),
        (status = 507, description = "`insufficient_storage`: the server's disk is full.", body = ErrorBody),
    ),
)]
pub async fn upload_batch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let mut multipart = multipart.map_err(not_multipart)?;
    let session_id = ids::new_id();
    let quota = Quota::of(&state.config);
    let mut fields = UploadFields::default();
    let mut parts: Vec<PartOutcome> = Vec::new();
    let result: Result<(), ApiError> = async {
        // Unlike /v1/upload, a caller at its quota is told so per file.
        let mut room = Room::lenient(&*state.files, &principal.0, quota).await?;
        while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
            let name = field.name().unwrap_or("").to_owned();
            if !matches!(name.as_str(), "file" | "files") {
                fields.take(&name, &mut field).await?;
                continue;
            }
            if parts.len() >= MAX_BATCH_PARTS {
                return Err(ApiError::bad_request(format!(
                    "at most {MAX_BATCH_PARTS} files per batch upload"
                )));
            }
            parts.push(receive_part(&state, &mut field, &mut room, true).await?);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        drop(parts);
        if matches!(
            e.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::INSUFFICIENT_STORAGE
        ) {
            drain(&mut multipart).await;
        }
        return Err(e);
    }
    if parts.is_empty() {
        return Err(ApiError::bad_request(
            "no file part: send the files in parts named `file`",
        ));
    }
    let mut files = Vec::with_capacity(parts.len());
    let created = now_ms();
    for part in parts {
        let (filename, outcome) = match part {
            PartOutcome::Received(r) => {
                let meta = r.meta(&principal, &session_id, &fields, &state.config, created);
                let temp = state.files.incoming_dir().join(&r.id);
                let size = meta.size;
                let outcome = state
                    .files
                    .insert(meta, &temp, quota)
                    .await
                    .map_err(|e| storage_error(e).into());
                if outcome.is_ok() {
                    crate::telemetry::stored(1, size);
                }
                (r.name.clone(), outcome.map(|()| r.id.clone()))
            }
            PartOutcome::Refused(name, e) => (name, Err(e)),
        };
        files.push(match outcome {
            Ok(id) => BatchFileResult {
                status: "success".into(),
                file_id: id,
                filename,
                error: None,
            },
            Err(e) => BatchFileResult {
                status: "error".into(),
                file_id: String::new(),
                filename,
                error: Some(e.message),
            },
        });
    }
    let succeeded = files.iter().filter(|f| f.status == "success").count();
    let failed = files.len() - succeeded;
    let mut body = BatchUploadResponse {
        message: if failed == 0 {
            "success"
        } else if succeeded > 0 {
            "partial_success"
        } else {
            "error"
        }
        .into(),
        storage_session_id: session_id,
        files,
        succeeded,
        failed,
        error: None,
        error_type: None,
    };
    if succeeded == 0 {
        body.error = Some("no file of the batch could be stored: see `files` for why".into());
        body.error_type = Some(sandcall_api::error_type::INVALID_REQUEST.into());
        return Ok((StatusCode::BAD_REQUEST, Json(body)).into_response());
    }
    Ok(Json(body).into_response())
}

/// How much of the caller's quota an upload may still use, from the usage last read.
/// It only lets the route refuse early, before bytes that could not be kept are written;
/// `FileStore::insert` makes the check that binds.
struct Room {
    principal: String,
    quota: Quota,
    usage: Usage,
    /// What this upload stored since `usage` was read.
    since: Usage,
}

impl Room {
    async fn open(store: &dyn FileStore, principal: &str, quota: Quota) -> Result<Room, ApiError> {
        let usage = store.usage(principal).await.map_err(storage_error)?;
        // At the byte quota to the byte, only empty files would fit: call that full.
        if usage.bytes >= quota.max_bytes {
            return Err(ApiError::quota_exceeded(
                QuotaExceeded::Bytes(quota.max_bytes).to_string(),
            ));
        }
        let room = Room {
            principal: principal.to_owned(),
            quota,
            usage,
            since: Usage::default(),
        };
        room.fits(0).map_err(|q| ApiError::quota_exceeded(q.to_string()))?;
        Ok(room)
    }

    /// A room that never refuses at open: a batch refuses each file that does not fit.
    async fn lenient(store: &dyn FileStore, principal: &str, quota: Quota) -> Result<Room, ApiError> {
        let usage = store.usage(principal).await.map_err(storage_error)?;
        Ok(Room {
            principal: principal.to_owned(),
            quota,
            usage,
            since: Usage::default(),
        })
    }

    fn fits(&self, size: u64) -> Result<(), QuotaExceeded> {
        let used = Usage {
            bytes: self.usage.bytes + self.since.bytes,
            files: self.usage.files + self.since.files,
        };
        used.check(self.quota, size, 1)
    }

    /// Whether one more file of `size` bytes (so far) fits. Before saying no it reads
    /// the usage again, since the caller may have deleted files meanwhile.
    async fn check(&mut self, store: &dyn FileStore, size: u64) -> Result<(), ApiError> {
        if self.fits(size).is_ok() {
            return Ok(());
        }
        self.usage = store.usage(&self.principal).await.map_err(storage_error)?;
        self.since = Usage::default();
        self.fits(size).map_err(|q| ApiError::quota_exceeded(q.to_string()))
    }

    fn stored(&mut self, size: u64) {
        self.since.bytes += size;
        self.since.files += 1;
    }
}

/// Reads and discards the rest of a refused upload (for at most `DRAIN_FOR`, and never
/// past the body limit). A client that sends its whole body before it reads the answer,
/// as most do, then gets the 413 or 507 rather than a connection reset by the unread
/// bytes.
async fn drain(multipart: &mut Multipart) {
    let rest = async {
        while let Ok(Some(mut field)) = multipart.next_field().await {
            while let Ok(Some(_)) = field.chunk().await {}
        }
    };
    let _ = tokio::time::timeout(crate::extract::DRAIN_FOR, rest).await;
}

/// Removes a half-received upload when dropped.
struct PartialUpload(std::path::PathBuf);

impl Drop for PartialUpload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The path of one stored file, on the routes that read or delete it.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct FilePath {
    /// The `storage_session_id` the file is stored under.
    session_id: String,
    /// The file's id.
    file_id: String,
}

async fn find(state: &AppState, principal: &Principal, file: &FilePath) -> Result<FileMeta, ApiError> {
    // An object name from the list route (`{file_id}.{ext}`) names the file too: ids
    // have no `.`.
    let file_id = file.file_id.split_once('.').map_or(file.file_id.as_str(), |(id, _)| id);
    if !ids::is_id(&file.session_id) || !ids::is_id(file_id) {
        return Err(file_not_found().into());
    }
    state
        .files
        .get(&principal.0, &file.session_id, file_id)
        .await
        .map_err(storage_error)?
        .ok_or_else(|| file_not_found().into())
}

fn etag(meta: &FileMeta) -> String {
    format!("\"{}\"", &meta.sha256)
}

/// GET /v1/download/{session_id}/{file_id}: the bytes, streamed.
#[utoipa::path(
    get,
    path = "/v1/download/{session_id}/{file_id}",
    operation_id = "download_file",
    tag = "files",
    params(FilePath),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The file's bytes, with its stored content type.", content_type = "*/*", body = Vec<u8>,
            headers(
                ("Content-Disposition" = String, description = "`attachment; filename=\"NAME\"`."),
                ("ETag" = String, description = "The hex SHA-256 of the content, in double quotes."),
            )),
        (status = 404, description = "`file_not_found`.", body = ErrorBody),
    ),
)]
pub async fn download(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(file): ApiPath<FilePath>,
) -> Result<Response, ApiError> {
    let meta = find(&state, &principal, &file).await?;
    let reader = state.files.open(&meta).await.map_err(storage_error)?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let header = |v: &str| HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, header(&meta.content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.size));
    let base = meta.name.rsplit('/').next().unwrap_or("file");
    let ascii: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let disposition = format!("attachment; filename=\"{ascii}\"");
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&etag(&meta)) {
        headers.insert(header::ETAG, v);
    }
    Ok(response)
}

/// The query of GET /v1/files/{session_id}.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `simple` (the default), `summary`, `full` or `normalized`.
    detail: Option<String>,
    /// Leaves out files uploaded with another `kind`.
    kind: Option<String>,
    /// Leaves out files uploaded for another entity (`id` field).
    id: Option<String>,
}

/// How much GET /v1/files tells of each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    Simple,
    Summary,
    Full,
    Normalized,
}

impl Detail {
    fn parse(raw: Option<&str>) -> Result<Detail, ApiError> {
        match raw.unwrap_or("simple") {
            "simple" => Ok(Detail::Simple),
            "summary" => Ok(Detail::Summary),
            "full" => Ok(Detail::Full),
            "normalized" => Ok(Detail::Normalized),
            other => Err(ApiError::bad_request(format!(
                "`detail` must be `simple`, `summary`, `full` or `normalized`, not {other:?}"
            ))),
        }
    }
}

/// Whether a stored value passes a filter: a file stored without the value passes.
fn passes(filter: Option<&str>, stored: Option<&str>) -> bool {
    match (filter.filter(|f| !f.is_empty()), stored) {
        (Some(want), Some(have)) => want == have,
        _ => true,
    }
}

/// The entries of a listing, as `detail` asks.
fn listing(files: Vec<FileMeta>, detail: Detail) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = files
        .into_iter()
        .map(|m| {
            let summary = || FileSummary {
                name: object_name(&m),
                size: m.size,
                last_modified: rfc3339(m.created_ms),
                etag: etag(&m),
            };
            let value = match detail {
                Detail::Simple => serde_json::to_value(object_name(&m)),
                Detail::Summary => serde_json::to_value(summary()),
                Detail::Full => {
                    let s = summary();
                    serde_json::to_value(FileFull {
                        name: s.name,
                        size: s.size,
                        last_modified: s.last_modified,
                        etag: s.etag,
                        metadata: FileObjectMetadata {
                            content_type: m.content_type.clone(),
                            original_filename: m.name.clone(),
                            original_filename_encoded: "none".into(),
                        },
                        content_type: m.content_type.clone(),
                    })
                }
                Detail::Normalized => serde_json::to_value(FileNormalized {
                    id: m.id.clone(),
                    name: m.name.clone(),
                    storage_session_id: m.session_id.clone(),
                    size: m.size,
                    content_type: m.content_type.clone(),
                    last_modified: rfc3339(m.created_ms),
                    read_only: m.read_only.then_some(true),
                }),
            };
            value.unwrap_or(serde_json::Value::Null)
        })
        .collect();
    serde_json::Value::Array(entries)
}

/// GET /v1/files/{session_id}: the caller's files of that session (unknown → `[]`).
#[utoipa::path(
    get,
    path = "/v1/files/{session_id}",
    operation_id = "list_files",
    tag = "files",
    params(("session_id" = String, Path, description = "A `storage_session_id`."), ListQuery),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The caller's files of the session, oldest first; `[]` for an unknown session. `simple`: object names `{session_id}/{file_id}[.ext]` (strings); `summary`: `FileSummary`; `full`: `FileFull`; `normalized`: `FileNormalized`.",
            body = Vec<String>),
        (status = 400, description = "`invalid_request`: an unknown `detail`.", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(session_id): ApiPath<String>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let axum::extract::Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("bad query: {}", e.body_text())))?;
    let detail = Detail::parse(query.detail.as_deref())?;
    if !ids::is_id(&session_id) {
        return Ok(Json(serde_json::Value::Array(Vec::new())));
    }
    let files = state
        .files
        .list(&principal.0, &session_id)
        .await
        .map_err(storage_error)?
        .into_iter()
        .filter(|m| passes(query.kind.as_deref(), m.kind.as_deref()))
        .filter(|m| passes(query.id.as_deref(), m.entity_id.as_deref()))
        .collect();
    Ok(Json(listing(files, detail)))
}

/// GET /v1/sessions/{session_id}/objects/{file_id}: metadata without the bytes.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/objects/{file_id}",
    operation_id = "file_metadata",
    tag = "files",
    params(FilePath),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The file's metadata.", body = ObjectInfo),
        (status = 404, description = "`file_not_found`.", body = ErrorBody),
    ),
)]
pub async fn object(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(file): ApiPath<FilePath>,
) -> Result<Json<ObjectInfo>, ApiError> {
    let meta = find(&state, &principal, &file).await?;
    Ok(Json(ObjectInfo {
        last_modified: rfc3339(meta.created_ms),
        size: meta.size,
        content_type: meta.content_type.clone(),
        etag: etag(&meta),
    }))
}

/// DELETE /v1/files/{session_id}/{file_id}: 200 with what was deleted.
#[utoipa::path(
    delete,
    path = "/v1/files/{session_id}/{file_id}",
    operation_id = "delete_file",
    tag = "files",
    params(FilePath),
    responses(
        (status = 503, description = "`store_unavailable`: the file store (S3) could not be reached or did not answer; no file is half stored. Retry after `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The file is deleted.", body = DeleteFileResponse),
        (status = 404, description = "`file_not_found`.", body = ErrorBody),
    ),
)]
pub async fn remove(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(file): ApiPath<FilePath>,
) -> Result<Json<DeleteFileResponse>, ApiError> {
    let meta = find(&state, &principal, &file).await?;
    if !state
        .files
        .delete(&meta.principal, &meta.session_id, &meta.id)
        .await
        .map_err(storage_error)?
    {
        // Deleted by another request meanwhile.
        return Err(file_not_found().into());
    }
    Ok(Json(DeleteFileResponse {
        message: "File deleted successfully".into(),
        session_id: meta.session_id,
        file_id: meta.id,
    }))
}
