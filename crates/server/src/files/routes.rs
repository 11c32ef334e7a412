//! The file routes: upload, download, list, metadata, delete. Every lookup is by the
//! caller's principal: another principal's file is "not found".

use super::ops::{file_not_found, storage_error};
use super::{guess_type, now_ms, rfc3339, upload_name, FileMeta, FileStore, Quota, QuotaExceeded, Usage};
use crate::auth::Principal;
use crate::config::Config;
use crate::error::ApiError;
use crate::http::ApiPath;
use crate::ids;
use crate::AppState;
use axum::body::Body;
use axum::extract::multipart::{Multipart, MultipartRejection};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use sandcall_api::{ErrorBody, FileEntry, ObjectInfo, UploadResponse, UploadedFile};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// Parts per upload request.
const MAX_PARTS: usize = 100;

/// The body limit of an upload: every part at its largest, and the multipart framing.
/// Each part is capped on its own while it streams to disk.
pub fn upload_limit(config: &Config) -> usize {
    (config.max_file_bytes as usize)
        .saturating_mul(MAX_PARTS)
        .saturating_add(1 << 20)
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> ApiError {
    if crate::http::body_timed_out(&e) {
        crate::http::request_timeout()
    } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large("the upload is larger than the server accepts")
    } else {
        ApiError::bad_request(format!("malformed multipart body: {}", e.body_text()))
    }
}

/// POST /v1/upload: each part named `file` or `files` is streamed to disk, the size cap
/// checked as the bytes arrive.
#[utoipa::path(
    post,
    path = "/v1/upload",
    operation_id = "upload_files",
    tag = "files",
    request_body(content = crate::openapi::UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "Every file was stored, under one new `storage_session_id`.", body = UploadResponse),
        (status = 400, description = "`invalid_request`: no file part, more than 100, a name against the rules, or a malformed body.", body = ErrorBody),
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
    let mut multipart = multipart.map_err(|e| {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            sandcall_api::error_type::UNSUPPORTED_MEDIA_TYPE,
            format!("expected a multipart/form-data body: {}", e.body_text()),
        )
    })?;
    let session_id = ids::new_id();
    let max = state.config.max_file_bytes;
    let quota = Quota::of(&state.config);
    let mut stored: Vec<FileMeta> = Vec::new();
    let result: Result<(), ApiError> = async {
        // A caller already at its quota is refused before any byte is read.
        let mut room = Room::open(&*state.files, &principal.0, quota).await?;
        while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
            if !matches!(field.name(), Some("file" | "files")) {
                continue;
            }
            if stored.len() >= MAX_PARTS {
                return Err(ApiError::bad_request(format!("at most {MAX_PARTS} files per upload")));
            }
            let name = upload_name(field.file_name().unwrap_or("file")).map_err(ApiError::bad_request)?;
            let content_type = field
                .content_type()
                .filter(|c| !c.is_empty() && *c != "application/octet-stream")
                .map(str::to_owned)
                .unwrap_or_else(|| guess_type(&name));
            room.check(&*state.files, 0).await?;
            let id = ids::new_id();
            let temp = state.files.incoming_dir().join(&id);
            // A client that goes away mid-upload drops this future; the half-received
            // file goes with it (after `insert` has moved it, there is nothing to remove).
            let _partial = PartialUpload(temp.clone());
            let mut out = tokio::fs::File::create(&temp)
                .await
                .map_err(|e| storage_error(e.into()))?;
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let copied: Result<(), ApiError> = async {
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    size += chunk.len() as u64;
                    if size > max {
                        return Err(ApiError::too_large(format!(
                            "{name} is larger than {max} bytes (max_file_bytes)"
                        )));
                    }
                    // Stop at once a part that cannot fit, rather than at `insert`.
                    room.check(&*state.files, size).await?;
                    hasher.update(&chunk);
                    out.write_all(&chunk).await.map_err(|e| storage_error(e.into()))?;
                }
                out.flush().await.map_err(|e| storage_error(e.into()))
            }
            .await;
            drop(out);
            if let Err(e) = copied {
                let _ = tokio::fs::remove_file(&temp).await;
                return Err(e);
            }
            let created = now_ms();
            let meta = FileMeta {
                principal: principal.0.clone(),
                session_id: session_id.clone(),
                id,
                name,
                size,
                content_type,
                sha256: hasher.finalize().iter().map(|b| format!("{b:02x}")).collect(),
                created_ms: created,
                expires_ms: created + state.config.file_ttl_s * 1000,
            };
            if let Err(e) = state.files.insert(meta.clone(), &temp, quota).await {
                let _ = tokio::fs::remove_file(&temp).await;
                return Err(storage_error(e));
            }
            room.stored(size);
            stored.push(meta);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        // All or nothing: a failed request leaves no file behind.
        for meta in &stored {
            let _ = state.files.delete(&meta.principal, &meta.session_id, &meta.id).await;
        }
        if matches!(
            e.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::INSUFFICIENT_STORAGE
        ) {
            drain(&mut multipart).await;
        }
        return Err(e);
    }
    if stored.is_empty() {
        return Err(ApiError::bad_request(
            "no file part: send the file in a part named `file`",
        ));
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
    let _ = tokio::time::timeout(crate::http::DRAIN_FOR, rest).await;
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
    if !ids::is_id(&file.session_id) || !ids::is_id(&file.file_id) {
        return Err(file_not_found());
    }
    state
        .files
        .get(&principal.0, &file.session_id, &file.file_id)
        .await
        .map_err(storage_error)?
        .ok_or_else(file_not_found)
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

/// GET /v1/files/{session_id}: the caller's files of that session (unknown → `[]`).
#[utoipa::path(
    get,
    path = "/v1/files/{session_id}",
    operation_id = "list_files",
    tag = "files",
    params(("session_id" = String, Path, description = "A `storage_session_id`.")),
    responses((status = 200, description = "The caller's files of the session, oldest first; `[]` for an unknown session.", body = Vec<FileEntry>)),
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(session_id): ApiPath<String>,
) -> Result<Json<Vec<FileEntry>>, ApiError> {
    if !ids::is_id(&session_id) {
        return Ok(Json(Vec::new()));
    }
    let files = state
        .files
        .list(&principal.0, &session_id)
        .await
        .map_err(storage_error)?;
    Ok(Json(
        files
            .into_iter()
            .map(|m| FileEntry {
                id: m.id,
                name: m.name,
                size: m.size,
                last_modified: rfc3339(m.created_ms),
                content_type: m.content_type,
            })
            .collect(),
    ))
}

/// GET /v1/sessions/{session_id}/objects/{file_id}: metadata without the bytes.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/objects/{file_id}",
    operation_id = "file_metadata",
    tag = "files",
    params(FilePath),
    responses(
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

/// DELETE /v1/files/{session_id}/{file_id}: 204.
#[utoipa::path(
    delete,
    path = "/v1/files/{session_id}/{file_id}",
    operation_id = "delete_file",
    tag = "files",
    params(FilePath),
    responses(
        (status = 204, description = "The file is deleted."),
        (status = 404, description = "`file_not_found`.", body = ErrorBody),
    ),
)]
pub async fn remove(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(file): ApiPath<FilePath>,
) -> Result<StatusCode, ApiError> {
    let meta = find(&state, &principal, &file).await?;
    state
        .files
        .delete(&meta.principal, &meta.session_id, &meta.id)
        .await
        .map_err(storage_error)?;
    Ok(StatusCode::NO_CONTENT)
}
