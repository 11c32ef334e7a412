//! The OpenAPI 3.1 document of the HTTP API, generated from the routes' annotations and
//! the wire types of `sandcall-api`. Served at GET /openapi.json and checked in as
//! docs/openapi.json (a test fails when the two differ).

use sandcall_api::{
    BatchUploadResponse, DeleteFileResponse, ErrorBody, ExecRequest, ExecResponse, FileFull, FileNormalized,
    FileSummary, Health, ObjectInfo, ProgrammaticRequest, ProgrammaticResponse, UploadResponse,
};
use serde_json::{json, Value};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandcall",
        description = "Runs untrusted Python and Bash programs in a Linux sandbox, with \
            programmatic tool calling. docs/api.md is the full reference.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(
        ErrorBody,
        sandcall_api::CallsResponse,
        sandcall_api::AuditCall,
        sandcall_api::AuditOutcome,
        ExecRequest,
        ExecResponse,
        Health,
        ProgrammaticRequest,
        ProgrammaticResponse,
        UploadResponse,
        BatchUploadResponse,
        FileSummary,
        FileFull,
        FileNormalized,
        DeleteFileResponse,
        ObjectInfo,
        UploadForm,
        BatchUploadForm,
        sandcall_api::RuntimesResponse,
        sandcall_api::RuntimeInfo,
        sandcall_api::RuntimePackage,
        sandcall_api::NetworkRequest,
        sandcall_api::NetworkSummary,
    ))
)]
struct ApiDoc;

/// The multipart body of POST /v1/upload.
#[derive(ToSchema)]
#[allow(dead_code)] // Only its schema is used: the handler reads the parts as a stream.
pub struct UploadForm {
    /// A file. Up to 100 parts named `file` or `files` may be sent in one request. The
    /// part's filename may be a relative path (`skill/scripts/run.py`), kept as it is.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// Stored with every file of the request (`user`, `skill`, ...). Each text field may
    /// be sent once; a second one is refused.
    #[schema(nullable = false)]
    kind: Option<String>,
    /// The entity the files belong to, stored with every file (`entity_id` is read too).
    #[schema(nullable = false)]
    id: Option<String>,
    #[schema(nullable = false)]
    version: Option<String>,
    /// `true` (or `1`): the files are staged but never returned as outputs of a run.
    /// `false`, `0` or empty: the default. Any other value is refused.
    #[schema(nullable = false, pattern = "^(true|false|1|0)?$")]
    read_only: Option<String>,
}

/// The multipart body of POST /v1/upload/batch.
#[derive(ToSchema)]
#[allow(dead_code)] // Only its schema is used: the handler reads the parts as a stream.
pub struct BatchUploadForm {
    /// A file. Up to 200 parts named `file` or `files`; each is stored or refused on its
    /// own. The filename may be a relative path, kept as it is.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    #[schema(nullable = false)]
    kind: Option<String>,
    #[schema(nullable = false)]
    id: Option<String>,
    #[schema(nullable = false)]
    version: Option<String>,
    /// As on /v1/upload.
    #[schema(nullable = false, pattern = "^(true|false|1|0)?$")]
    read_only: Option<String>,
}

/// What every operation shares: the API key schemes, 401 when keys are configured and the
/// request has none, 403 and 421 of local mode, 500 for a handler that failed, 413 and 415
/// where a JSON body is read (`JsonBody`), 408 where any body is read, and 400 for a path
/// parameter that is not UTF-8 (`ApiPath`).
struct Common;

impl Modify for Common {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <API key>`, or `Authorization: Bearer <JWT>` signed by LibreChat \
                         (EdDSA or RS256; see docs/configuration.md, LibreChat JWTs)",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "`X-API-Key: <key>`",
            ))),
        );
        // Either scheme; with no keys configured (local mode) none is needed.
        doc.security = Some(vec![
            utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new()),
            utoipa::openapi::security::SecurityRequirement::new("api_key", Vec::<String>::new()),
            utoipa::openapi::security::SecurityRequirement::default(),
        ]);
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.delete,
                &mut item.put,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let json_body = op
                    .request_body
                    .as_ref()
                    .is_some_and(|body| matches!(body, RefOr::T(b) if b.content.contains_key("application/json")));
                if json_body {
                    // What `JsonBody` answers on every route that reads one.
                    add_error(op, "413", "`payload_too_large`: the body is over the limit.");
                    add_error(
                        op,
                        "415",
                        "`unsupported_media_type`: the body is not JSON (in local mode: or has no `Content-Type`).",
                    );
                }
                if op.request_body.is_some() {
                    add_error(
                        op,
                        "408",
                        "`request_timeout`: the body did not arrive whole within `body_read_timeout_ms`.",
                    );
                }
                // What local mode refuses on every route, before anything else.
                add_error(
                    op,
                    "403",
                    "Local mode: `forbidden_origin`, the request comes from a web page of another origin.",
                );
                add_error(
                    op,
                    "421",
                    "Local mode: `misdirected_request`, `Host` is not a loopback name.",
                );
                if op.parameters.as_ref().is_some_and(|p| !p.is_empty()) {
                    add_error(op, "400", "`invalid_request`: a path parameter is not valid UTF-8.");
                }
                add_error(
                    op,
                    "401",
                    "Credentials (API keys or JWT keys) are configured and the request has no valid API key \
                     or JWT (`unauthorized`, with `WWW-Authenticate: Bearer`); the message says which class of rule a JWT broke.",
                );
                add_error(
                    op,
                    "500",
                    "A handler failed (`internal`); the cause is in the server's log.",
                );
            }
        }
    }
}

fn add_error(op: &mut Operation, status: &str, description: &str) {
    op.responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| RefOr::T(error_response(description)));
}

/// A response whose body is the error shape every route answers with.
fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name("ErrorBody"))))
                .build(),
        )
        .build()
}

/// Links from the answers that create files and sessions to the operations that use them,
/// so that a client (or a fuzzer) can follow them.
fn add_links(doc: &mut Value) {
    let file_links = |session: &str, file: &str| {
        let params = json!({"session_id": session, "file_id": file});
        json!({
            "DownloadFile": {"operationId": "download_file", "parameters": params},
            "FileMetadata": {"operationId": "file_metadata", "parameters": params},
            "DeleteFile": {"operationId": "delete_file", "parameters": params},
        })
    };
    let paths = &mut doc["paths"];
    paths["/v1/upload"]["post"]["responses"]["200"]["links"] =
        file_links("$response.body#/storage_session_id", "$response.body#/files/0/id");
    paths["/v1/exec"]["post"]["responses"]["200"]["links"] = file_links(
        "$response.body#/files/0/storage_session_id",
        "$response.body#/files/0/id",
    );
    paths["/v1/upload"]["post"]["responses"]["200"]["links"]["ListFiles"] = json!({
        "operationId": "list_files",
        "parameters": {"session_id": "$response.body#/storage_session_id"},
    });
    paths["/v1/exec/programmatic"]["post"]["responses"]["200"]["links"] = json!({
        "GetSession": {
            "operationId": "get_session",
            "parameters": {"session_id": "$response.body#/session_id"},
        },
        "CancelSession": {
            "operationId": "cancel_session",
            "requestBody": {"session_id": "$response.body#/session_id"},
        },
    });
}

/// The answers whose body is one of several shapes, which the route annotations cannot
/// say: the list route's four detail levels, and the batch upload's 400 (the batch body
/// when every file failed, the error body otherwise). `anyOf`, since `[]` fits them all.
fn add_alternatives(doc: &mut Value) {
    let schema = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let list = |items: Value| json!({"type": "array", "items": items});
    let paths = &mut doc["paths"];
    paths["/v1/files/{session_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] = json!({
        "anyOf": [
            list(json!({"type": "string", "description": "`{session_id}/{file_id}` plus the file's extension, if any."})),
            list(schema("FileSummary")),
            list(schema("FileFull")),
            list(schema("FileNormalized")),
        ]
    });
    paths["/v1/upload/batch"]["post"]["responses"]["400"]["content"]["application/json"]["schema"] =
        json!({"anyOf": [schema("BatchUploadResponse"), schema("ErrorBody")]});
    // Only the session: the first file of a partial success may be one that failed.
    paths["/v1/upload/batch"]["post"]["responses"]["200"]["links"] = json!({
        "ListFiles": {"operationId": "list_files", "parameters": {"session_id": "$response.body#/storage_session_id"}},
    });
}

/// The document, as served and checked in (pretty JSON with a final newline), with the
/// paths (and the schemas they name) of the routes the router serves.
pub fn document(paths: utoipa::openapi::OpenApi) -> String {
    let mut doc = ApiDoc::openapi();
    doc.merge(paths);
    Common.modify(&mut doc);
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut value = serde_json::to_value(&doc).unwrap_or_default();
    add_links(&mut value);
    add_alternatives(&mut value);
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}
