//! Configuration: defaults, then the TOML file, then `SANDCALL_*` environment variables,
//! then command-line flags. docs/configuration.md lists every key; a test keeps the two
//! in step.

// Configuration errors are answered at start, not on request paths (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod rate;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Every server setting. Each field's doc comment gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address and port to listen on. Default `127.0.0.1:3112`.
    pub listen: String,
    /// Directory for the server's state and the runs' staging directories.
    /// Default `./sandcall-data`.
    pub data_dir: PathBuf,
    /// Runs executing at once. Default: number of cores × 4.
    pub max_concurrent_runs: usize,
    /// Runs waiting for a slot; beyond this a request gets 503 `at_capacity`.
    /// Default: `max_concurrent_runs` × 4.
    pub max_queued_runs: Option<usize>,
    /// Longest wait for a slot, in ms, before 503 `at_capacity`. Default 10000.
    pub queue_timeout_ms: u64,
    /// Wall-clock budget of a run when the request names none, in ms. Default:
    /// `max_run_timeout_ms`.
    pub run_timeout_ms: Option<u64>,
    /// Most wall-clock time a request may ask for, in ms. Default 300000.
    pub max_run_timeout_ms: u64,
    /// Largest `code`, in bytes. Default 1048576 (1 MiB).
    pub max_code_bytes: u64,
    /// Largest `stdin`, in bytes. Default 1048576 (1 MiB).
    pub max_stdin_bytes: u64,
    /// Bytes kept of stdout and of stderr, each. Default 65536.
    pub max_output_bytes: u64,
    /// Memory of a run, tmpfs contents included, in MiB; no swap. Default 512.
    pub memory_limit_mb: u64,
    /// Processes and threads of a run. Default 128.
    pub max_processes: u64,
    /// Open files per process. Default 1024.
    pub max_open_files: u64,
    /// Largest file a process may write, in MiB. Default 256.
    pub file_size_limit_mb: u64,
    /// Size of the working directory `/mnt/data`, in MiB. Default 256.
    pub workspace_limit_mb: u64,
    /// Size of `/tmp` and of `/dev/shm`, each, in MiB. Default 128.
    pub tmp_limit_mb: u64,
    /// CPU time of a run, all processes together, in ms. Default 300000.
    pub cpu_time_limit_ms: u64,
    /// CPU share of a run (1.0 = one core). Default 1.0.
    pub cpus: f64,
    /// Programmatic runs: a pending tool call with no result after this many ms raises
    /// TimeoutError in the program. Default 300000.
    pub tool_call_timeout_ms: u64,
    /// Programmatic runs: a paused session not resumed within this many seconds is
    /// ended and its sandbox reclaimed. Default 600.
    pub session_expiry_s: u64,
    /// Programmatic runs: a paused session idle this many seconds is written out (its
    /// journal is already in the session store) and its sandbox freed; a resume brings it
    /// back by replay. 0: never. Default 120.
    pub session_idle_evict_s: u64,
    /// Tool calls one programmatic run may make: the default and the ceiling of the
    /// request's `max_tool_calls`. Default 100.
    pub max_tool_calls: u64,
    /// Largest tool call (its arguments as JSON), in bytes. Default 1048576.
    pub max_tool_call_bytes: u64,
    /// Programmatic sessions alive at once, paused ones included; beyond this a new one
    /// gets 503 `at_capacity`. Default: number of cores × 32.
    pub max_sessions: usize,
    /// Key that signs continuation tokens, as 64 hex characters. Default: generated on
    /// first start into `<data_dir>/token.key` (mode 0600) and kept there.
    pub token_secret: Option<String>,
    /// Where programmatic sessions are journalled: absent or `"embedded"`, the data dir
    /// (`<data_dir>/sessions.redb`); `"redis://host:port/db"`, a Redis that every node of
    /// a cluster shares (then `node_url` and `token_secret` are required). Default
    /// embedded.
    pub session_store: Option<String>,
    /// How the other nodes of a cluster reach this one (`http://host:port`): a resume,
    /// GET or cancel of a session this node holds live is forwarded here. Also this
    /// node's id in the session store's leases, so it must be unique per node. Default
    /// none (one node).
    pub node_url: Option<String>,
    /// With a shared session store: how long a node's ownership of a live session lasts
    /// unless renewed, in ms (renewed every third of it while the node lives). After a
    /// node dies, its sessions are taken over by replay once this has passed. Default
    /// 10000.
    pub node_lease_ms: u64,
    /// For tests of the server itself: enables `GET /v1/_fault/panic`, whose handler
    /// panics (to check that a panic is answered 500 and the server goes on). Default
    /// false; never turn it on in production.
    pub fault_injection: bool,
    /// Warm sandboxes kept ready per language (Python, Bash), each with its
    /// interpreter started; 0 turns the pool off. Each holds up to `memory_limit_mb`.
    /// Default 4.
    pub warm_pool_size: usize,
    /// The languages that get a warm set of `warm_pool_size` sandboxes (names or
    /// aliases); a language whose toolchain is missing gets none. Default all four:
    /// python, bash, javascript, typescript.
    pub warm_languages: Vec<String>,
    /// The most a request's `limits` may ask for; each defaults to the value above.
    pub ceilings: Ceilings,
    /// Python interpreter, an absolute path inside the runtime. Default `/usr/bin/python3`.
    pub python: PathBuf,
    /// Bash interpreter. Default `/usr/bin/bash`.
    pub bash: PathBuf,
    /// Node.js, which runs JavaScript and TypeScript. Default `/usr/bin/node`. When it is
    /// missing, `js` and `ts` answer `unsupported_capability`.
    pub node: PathBuf,
    /// The TypeScript transpiler: the directory of the `sucrase` npm package (its
    /// `node_modules` directory is bound read-only into every sandbox). Default none:
    /// `ts` answers `unsupported_capability`.
    pub typescript_transpiler: Option<PathBuf>,
    /// More host paths bound read-only into every sandbox (an interpreter outside /usr,
    /// say). Default none.
    pub extra_runtime_paths: Vec<PathBuf>,
    /// Directories, in order, where the compiled languages' toolchains (gcc, go, java,
    /// ...) are looked up; each one outside /usr is bound read-only into every sandbox
    /// and put first on the program's PATH. A language whose commands are not found
    /// answers `unsupported_capability`. Default `["/usr/bin"]`.
    pub toolchain_path: Vec<PathBuf>,
    /// Languages the operator declares (`[[languages]]`): names, code file, optional
    /// compile command, run command, commands and paths the toolchain needs
    /// (docs/runtimes.md, "Languages an operator declares"). Default none.
    pub languages: Vec<LanguageConfig>,
    /// MCP servers whose tools programs may call (`[[mcp_servers]]`: name, command,
    /// args, env): a declared tool with `mcp_server` is called by sandcall, as an MCP
    /// client over stdio, and its result goes back to the program (docs/mcp.md).
    /// Default none.
    pub mcp_servers: Vec<McpServerConfig>,
    /// Modules the preloaded warm Python sandboxes import while they wait, when Python
    /// runs on the managed runtime, so a run's own import of them costs nothing; each a
    /// dotted module name. They count against the run's `memory_limit_mb`. A run whose
    /// code imports one of them (its top-level package) takes a preloaded sandbox, any
    /// other run a plain one (docs/runtimes.md#warm-imports). Empty turns it off.
    /// Default `["numpy", "pandas", "matplotlib.pyplot"]`.
    pub warm_preload: Vec<String>,
    /// Preloaded warm Python sandboxes kept ready beside the `warm_pool_size` plain
    /// ones; each holds about 90 MiB and takes about a second of CPU to build. 0 turns
    /// them off. Default 2.
    pub warm_preload_pool_size: usize,
    /// Fork the warm Python sandboxes (plain and preloaded) from a template per set
    /// that has started the interpreter and imported the preloads (a "zygote",
    /// ARCHITECTURE.md "Forked runs"), instead of starting an interpreter in each;
    /// while a template is being (re)built, warm sandboxes are built the usual way.
    /// Needs the server to run as root (without it, a note in the log, and no
    /// template). Default true.
    pub zygote: bool,
    /// Where managed runtimes are installed (`sandcall runtime install`), one directory
    /// per lock (`python-<hash>`), bound read-only into every sandbox; may be shared by
    /// several data dirs. Default `<data_dir>/runtimes`.
    pub runtime_dir: Option<PathBuf>,
    /// `serve` installs the Python runtime on first start when it is missing (minutes,
    /// once; without registry access it warns and runs on the bare `python`). Default true.
    pub install_runtime: bool,
    /// Host uid the sandbox user maps to. Default 65534 (nobody) as root, else your uid.
    pub sandbox_uid: Option<u32>,
    /// Host gid the sandbox user maps to. Default 65534 as root, else your gid.
    pub sandbox_gid: Option<u32>,
    /// A cgroup v2 directory to create run cgroups in (a delegated subtree). Default:
    /// detected, `<hierarchy>/sandcall-<hash of data_dir>`.
    pub cgroup_root: Option<PathBuf>,
    /// API keys, each mapping to a principal, stored as SHA-256 hashes:
    /// `[[api_keys]] principal = "alice" sha256 = "<hex>"` (`sandcall keys add NAME` adds
    /// one). SANDCALL_API_KEYS=`principal:key,principal:key` adds plain keys. Default
    /// none: local mode (one principal, no authentication, loopback only).
    pub api_keys: Vec<ApiKey>,
    /// With no credentials, listen on a non-loopback address anyway: for a private network
    /// whose every host may run code (LibreChat and sandcall side by side in containers,
    /// say). A warning at start. Requests may then name the server by any host; foreign
    /// `Origin`s and JSON bodies without `Content-Type` are still refused. Default false.
    pub allow_unauthenticated: bool,
    /// LibreChat's JWTs: where their keys come from and the rules of the check (the
    /// `[jwt]` table, or the Code Interpreter API's `CODEAPI_JWT_*` variables). With no key
    /// source set, JWTs are off.
    pub jwt: JwtConfig,
    /// Largest uploaded or output file, in bytes. Default 26214400 (25 MiB).
    pub max_file_bytes: u64,
    /// Output files collected from one run. Default 100.
    pub max_output_files: usize,
    /// Files (uploads and outputs) are deleted this many seconds after they were
    /// stored. Default 86400 (24 h).
    pub file_ttl_s: u64,
    /// How often expired files are swept, in seconds. Default 60.
    pub file_sweep_interval_s: u64,
    /// Programmatic runs: bytes of tool-call arguments (as JSON) handed out in one
    /// pause, all its calls together; a call that would go over is refused in the
    /// program. Default 4194304 (4 MiB).
    pub max_pause_bytes: u64,
    /// Programmatic runs: bytes of tool-call arguments one session may hand out over
    /// its whole life. Default 33554432 (32 MiB).
    pub max_session_tool_bytes: u64,
    /// Programmatic runs: the largest result of one tool call, as the JSON text the
    /// caller sends, in bytes; a resume's body may hold three results this size (see
    /// `max_programmatic_body_bytes`). Default 5242880 (5 MiB).
    pub max_tool_result_bytes: u64,
    /// Programmatic runs: what `timeout` bounds. `run` (the default): the program's own
    /// running time, the clock stopped while it waits for its caller; `loop`: the whole
    /// loop, the waits included.
    pub programmatic_timeout_scope: TimeoutScope,
    /// Programmatic sessions one principal may hold at once, paused ones included;
    /// past it a new one gets 429 `principal_at_capacity`. Default: `max_sessions` / 4
    /// (at least 1) with credentials, `max_sessions` in local mode.
    pub max_sessions_per_principal: Option<usize>,
    /// Runs (`/v1/exec` and running programmatic sessions) one principal may have
    /// running or queued at once; past it a request gets 429 `principal_at_capacity`.
    /// Default: `max_concurrent_runs` / 2 (at least 1) with credentials; no cap of its
    /// own in local mode.
    pub max_runs_per_principal: Option<usize>,
    /// Bytes of files (uploads and outputs) one principal may have stored at once;
    /// past it an upload gets 507 `quota_exceeded` and an output file is skipped.
    /// Default 2147483648 (2 GiB).
    pub max_stored_bytes_per_principal: u64,
    /// Files one principal may have stored at once. Default 10000.
    pub max_stored_files_per_principal: u64,
    /// Requests one principal may make to start programs (`POST /v1/exec`, programmatic
    /// starts), as `N/s`, `N/min` or `N/h`: a burst of N, then one more every period /
    /// N; past it 429 `rate_limited`. Default: none (not limited).
    pub rate_limit_exec: Option<String>,
    /// The same for driving sessions (resumes, `GET` of a session, cancels). Default:
    /// none.
    pub rate_limit_sessions: Option<String>,
    /// The same for the file routes (uploads, downloads, lists, deletes). Default: none.
    pub rate_limit_files: Option<String>,
    /// Where stored files live: `embedded` (the data dir; the default, also when unset)
    /// or `s3://bucket/prefix`, an S3-compatible object store that every node of a
    /// cluster shares (credentials and region from the standard `AWS_*` variables).
    pub file_store: Option<String>,
    /// The S3 endpoint's URL, for S3-compatible servers (`http://127.0.0.1:9000`); plain
    /// http is allowed only for a loopback host. Default: AWS's own endpoint.
    pub s3_endpoint: Option<String>,
    /// With an S3 file store: the local cache of stored files (inputs are staged from
    /// it), in MiB; files older than a few minutes are evicted past it. Default 1024.
    pub file_cache_mb: u64,
    /// With an S3 file store: how long a request to S3 may take, in ms, and how long
    /// after its first try a failed one is still retried; S3 out of reach is answered
    /// `503 store_unavailable` within about twice this. Default 30000.
    pub s3_timeout_ms: u64,
    /// Workspaces: a `/v1/exec` request with `runtime_session_hint` or `workspace_id`
    /// starts in the working directory its principal's previous run with the same one
    /// left. Default false (the hint is then ignored, `workspace_id` refused).
    pub workspaces: bool,
    /// Longest time a client may take to send a request's headers, in ms; then the
    /// connection is closed. Default 10000.
    pub header_read_timeout_ms: u64,
    /// Longest time a client may take to send a request's whole body, in ms; then the
    /// request gets 408 `request_timeout`. Default 120000.
    pub body_read_timeout_ms: u64,
    /// An idle keep-alive connection (no request under way) is closed after this many
    /// ms. Default 20000.
    pub keep_alive_timeout_ms: u64,
    /// Client connections open at once; more wait to be accepted. Default 2048 (less if
    /// the open-files limit cannot be raised to fit them).
    pub max_connections: usize,
}

/// A language the operator declares (`[[languages]]`). Its commands are Bash command
/// lines: `compile` runs in the code directory, `run` in the working directory with the
/// program's arguments after it; `$CODE` is the code file's path, `$BUILD` an empty
/// directory on the run's /tmp.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LanguageConfig {
    /// The names it answers to (any case), its own name first.
    pub names: Vec<String>,
    /// The code's file name (`main.awk`).
    pub code_file: String,
    /// Compiles the code; a failure ends the run with its status.
    #[serde(default)]
    pub compile: Option<String>,
    /// Runs the program: a simple command.
    pub run: String,
    /// Commands it needs, looked up in `toolchain_path` (or absolute paths); when one
    /// is missing the language answers `unsupported_capability`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Host paths bound read-only into every sandbox (its toolchain outside /usr).
    #[serde(default)]
    pub paths: Vec<PathBuf>,
}

/// An MCP server programs' tools may go to (`[[mcp_servers]]`): sandcall starts
/// `command` with `args` (and `env` added to its own environment) on first use, and
/// speaks MCP to it over its stdin and stdout.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// What tool declarations name it by (`mcp_server`).
    pub name: String,
    /// The program to start: an absolute path, or a name looked up in PATH.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// One API key: the principal it stands for and the SHA-256 of the key, in hex.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub principal: String,
    pub sha256: String,
}

/// LibreChat's JWTs (`[jwt]`). Every key also comes from its `CODEAPI_JWT_*` variable,
/// the names the Code Interpreter API reads, which wins over the file. The keys
/// themselves are loaded and checked at start (`auth::jwt`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// A JWKS document, as JSON text (`{"keys": [...]}`); keys without a `kid` are
    /// ignored. CODEAPI_JWT_JWKS_JSON. Default none.
    pub jwks_json: Option<String>,
    /// A folder of public keys, one per file, in PEM (or JWK JSON); a file's name without
    /// its extension is its kid. CODEAPI_JWT_PUBLIC_KEYS_DIR. Default none.
    pub public_keys_dir: Option<PathBuf>,
    /// One public key, as PEM text (line breaks may be written `\n`) or a JWK JSON
    /// object; not a path. Needs `kid`. CODEAPI_JWT_PUBLIC_KEY. Default none.
    pub public_key: Option<String>,
    /// The kid of `public_key`. CODEAPI_JWT_KID (or CODEAPI_JWT_KEY_ID). Default none.
    pub kid: Option<String>,
    /// A shared secret for HS256 tokens, for development; HS256 must also be in
    /// `allowed_algs`. CODEAPI_JWT_HS256_SECRET. Default none.
    pub hs256_secret: Option<String>,
    /// The kid of `hs256_secret`. CODEAPI_JWT_HS256_KID. Default: `kid` if set, else
    /// `hs256-dev`.
    pub hs256_kid: Option<String>,
    /// Algorithms a token may use, out of `EdDSA`, `RS256`, `HS256`: a list, or one
    /// comma-separated string. CODEAPI_JWT_ALLOWED_ALGS. Default `EdDSA,RS256`.
    #[serde(deserialize_with = "names_or_comma_list")]
    pub allowed_algs: Vec<String>,
    /// The `iss` a token must have. CODEAPI_JWT_ISSUER. Default `librechat`.
    pub issuer: String,
    /// The `aud` a token must have (or include, when a list). CODEAPI_JWT_AUDIENCE.
    /// Default `codeapi`.
    pub audience: String,
    /// Tolerance on `exp`, `nbf` and `iat`, in seconds, at most 300.
    /// CODEAPI_JWT_CLOCK_SKEW_SECONDS. Default 30.
    pub clock_skew_seconds: u64,
    /// Longest lifetime (`exp - iat`) a token may have, in seconds, 1 to 86400.
    /// CODEAPI_JWT_MAX_TTL_SECONDS. Default 300.
    pub max_ttl_seconds: u64,
    /// The tenant of a token without `tenant_id`. CODEAPI_JWT_SINGLE_TENANT_ID. Default
    /// `legacy`, what LibreChat sends when it has no tenants.
    pub single_tenant_id: String,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            jwks_json: None,
            public_keys_dir: None,
            public_key: None,
            kid: None,
            hs256_secret: None,
            hs256_kid: None,
            allowed_algs: vec!["EdDSA".into(), "RS256".into()],
            issuer: "librechat".into(),
            audience: "codeapi".into(),
            clock_skew_seconds: 30,
            max_ttl_seconds: 300,
            single_tenant_id: "legacy".into(),
        }
    }
}

impl JwtConfig {
    /// Some key source is set: JWTs are on (and the server is not in local mode).
    pub fn has_key_source(&self) -> bool {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
        set(&self.jwks_json)
            || self.public_keys_dir.as_ref().is_some_and(|d| !d.as_os_str().is_empty())
            || set(&self.public_key)
            || self.hs256_secret.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// `["EdDSA", "RS256"]` in the file, `EdDSA,RS256` in the environment.
fn names_or_comma_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        One(String),
        List(Vec<String>),
    }
    Ok(match Names::deserialize(d)? {
        Names::One(s) => s
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
        Names::List(l) => l.into_iter().map(|n| n.trim().to_owned()).collect(),
    })
}

/// The Code Interpreter API's variables and the `[jwt]` keys they set. Read as plain
/// text (a JWKS or a PEM must not go through figment's value parsing); an empty one is
/// unset, as there.
const CODEAPI_JWT_ENV: &[(&str, &str)] = &[
    ("CODEAPI_JWT_JWKS_JSON", "jwks_json"),
    ("CODEAPI_JWT_PUBLIC_KEYS_DIR", "public_keys_dir"),
    ("CODEAPI_JWT_PUBLIC_KEY", "public_key"),
    // CODEAPI_JWT_KID wins over its older name.
    ("CODEAPI_JWT_KEY_ID", "kid"),
    ("CODEAPI_JWT_KID", "kid"),
    ("CODEAPI_JWT_HS256_SECRET", "hs256_secret"),
    ("CODEAPI_JWT_HS256_KID", "hs256_kid"),
    ("CODEAPI_JWT_ALLOWED_ALGS", "allowed_algs"),
    ("CODEAPI_JWT_ISSUER", "issuer"),
    ("CODEAPI_JWT_AUDIENCE", "audience"),
    ("CODEAPI_JWT_CLOCK_SKEW_SECONDS", "clock_skew_seconds"),
    ("CODEAPI_JWT_MAX_TTL_SECONDS", "max_ttl_seconds"),
    ("CODEAPI_JWT_SINGLE_TENANT_ID", "single_tenant_id"),
];

/// Merges the `CODEAPI_JWT_*` variables that are set over `figment`.
fn merge_codeapi_jwt_env(mut figment: Figment) -> Result<Figment, ConfigError> {
    if std::env::var_os("CODEAPI_JWT_TRUST_ENTRIES_JSON").is_some() {
        return Err(ConfigError::Invalid(
            "CODEAPI_JWT_TRUST_ENTRIES_JSON is not supported: set CODEAPI_JWT_ISSUER, CODEAPI_JWT_AUDIENCE and \
             CODEAPI_JWT_ALLOWED_ALGS (or [jwt] in the config file) instead"
                .into(),
        ));
    }
    for (var, key) in CODEAPI_JWT_ENV {
        let value = match std::env::var(var) {
            Ok(v) if v.trim().is_empty() => continue,
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => continue,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(ConfigError::Invalid(format!("{var} is not valid UTF-8")))
            }
        };
        let path = format!("jwt.{key}");
        figment = if key.ends_with("_seconds") {
            let n: u64 = value
                .trim()
                .parse()
                .map_err(|_| ConfigError::Invalid(format!("{var} must be a whole number of seconds")))?;
            figment.merge(Serialized::default(&path, n))
        } else {
            figment.merge(Serialized::default(&path, value))
        };
    }
    Ok(figment)
}

/// Hex SHA-256 of an API key, as stored.
pub fn key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn valid_principal(p: &str) -> bool {
    (1..=64).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.@".contains(&b))
}

/// Parses SANDCALL_API_KEYS: `principal:key,principal:key`.
pub fn parse_env_keys(value: &str) -> Result<Vec<ApiKey>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| match entry.split_once(':') {
            Some((principal, key)) if valid_principal(principal) && key.len() >= 16 => Ok(ApiKey {
                principal: principal.to_owned(),
                sha256: key_hash(key),
            }),
            _ => Err(ConfigError::Invalid(
                "SANDCALL_API_KEYS must be principal:key pairs separated by commas, keys of 16 characters or more"
                    .into(),
            )),
        })
        .collect()
}

/// `sandcall keys add NAME`: makes a new key, appends its hash to the config file
/// (created if missing, mode 0600) and returns the key, which is not kept anywhere.
pub fn add_key(config_file: &Path, principal: &str) -> Result<String, ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if !valid_principal(principal) {
        return Err(ConfigError::Invalid(
            "a principal is 1 to 64 letters, digits, `_-.@`".into(),
        ));
    }
    let key = format!("sc_{}{}", sandcall_api::ids::new_id(), sandcall_api::ids::new_id());
    let entry = format!(
        "\n[[api_keys]]\nprincipal = \"{principal}\"\nsha256 = \"{}\"\n",
        key_hash(&key)
    );
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(config_file)
        .map_err(|e| ConfigError::Invalid(format!("open {}: {e}", config_file.display())))?;
    file.write_all(entry.as_bytes())
        .map_err(|e| ConfigError::Invalid(format!("write {}: {e}", config_file.display())))?;
    Ok(key)
}

/// Ceilings for the limits a request may set in `limits`: the same fields as the
/// request's own `limits` object (one type, so the two cannot drift apart). Unset means
/// "the default".
pub use sandcall_api::RequestLimits as Ceilings;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:3112".into(),
            data_dir: PathBuf::from("./sandcall-data"),
            max_concurrent_runs: cores() * 4,
            max_queued_runs: None,
            queue_timeout_ms: 10_000,
            run_timeout_ms: None,
            max_run_timeout_ms: 300_000,
            max_code_bytes: 1 << 20,
            max_stdin_bytes: 1 << 20,
            max_output_bytes: 65_536,
            memory_limit_mb: 512,
            max_processes: 128,
            max_open_files: 1024,
            file_size_limit_mb: 256,
            workspace_limit_mb: 256,
            tmp_limit_mb: 128,
            cpu_time_limit_ms: 300_000,
            cpus: 1.0,
            tool_call_timeout_ms: 300_000,
            session_expiry_s: 600,
            session_idle_evict_s: 120,
            max_tool_calls: 100,
            max_tool_call_bytes: 1 << 20,
            max_sessions: cores() * 32,
            token_secret: None,
            session_store: None,
            node_url: None,
            node_lease_ms: 10_000,
            warm_pool_size: 4,
            warm_languages: ["python", "bash", "javascript", "typescript"]
                .map(String::from)
                .to_vec(),
            fault_injection: false,
            ceilings: Ceilings::default(),
            python: PathBuf::from("/usr/bin/python3"),
            bash: PathBuf::from("/usr/bin/bash"),
            node: PathBuf::from("/usr/bin/node"),
            typescript_transpiler: None,
            extra_runtime_paths: Vec::new(),
            toolchain_path: vec![PathBuf::from("/usr/bin")],
            languages: Vec::new(),
            mcp_servers: Vec::new(),
            warm_preload: ["numpy", "pandas", "matplotlib.pyplot"].map(String::from).to_vec(),
            warm_preload_pool_size: 2,
            zygote: true,
            runtime_dir: None,
            install_runtime: true,
            sandbox_uid: None,
            sandbox_gid: None,
            cgroup_root: None,
            api_keys: Vec::new(),
            allow_unauthenticated: false,
            jwt: JwtConfig::default(),
            max_file_bytes: 26_214_400,
            max_output_files: 100,
            file_ttl_s: 86_400,
            file_sweep_interval_s: 60,
            max_pause_bytes: 4 << 20,
            max_session_tool_bytes: 32 << 20,
            max_tool_result_bytes: 5 << 20,
            programmatic_timeout_scope: TimeoutScope::Run,
            max_sessions_per_principal: None,
            max_runs_per_principal: None,
            max_stored_bytes_per_principal: 2 << 30,
            max_stored_files_per_principal: 10_000,
            rate_limit_exec: None,
            rate_limit_sessions: None,
            rate_limit_files: None,
            file_store: None,
            s3_endpoint: None,
            file_cache_mb: 1024,
            s3_timeout_ms: 30_000,
            workspaces: false,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 120_000,
            keep_alive_timeout_ms: 20_000,
            max_connections: 2048,
        }
    }
}

/// What a programmatic request's `timeout` bounds (`programmatic_timeout_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutScope {
    /// The program's own running time: the clock stops while it waits for its caller.
    Run,
    /// The whole loop, the waits for the caller included.
    Loop,
}

/// Values given as command-line flags, which win over everything else.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Parse(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

/// The top-level keys, for filtering the environment: only `SANDCALL_<KEY>` variables
/// that name a real key are read, so SANDCALL_LOG and friends do not trip the strict
/// check that catches typos in the file.
fn known_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl Config {
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        let keys = known_keys();
        // The filter sees the variable's name without the prefix, as written
        // (CEILINGS__MEMORY_LIMIT_MB), before `split` turns `__` into nesting.
        // SANDCALL_API_KEYS holds plain keys in its own format, read below.
        let env = Env::prefixed("SANDCALL_").filter(move |k| {
            let top = k.as_str().split("__").next().unwrap_or("");
            !top.eq_ignore_ascii_case("api_keys") && keys.iter().any(|known| known.eq_ignore_ascii_case(top))
        });
        figment = figment.merge(env.split("__"));
        figment = merge_codeapi_jwt_env(figment)?;
        if let Some(listen) = &overrides.listen {
            figment = figment.merge(Serialized::default("listen", listen));
        }
        if let Some(dir) = &overrides.data_dir {
            figment = figment.merge(Serialized::default("data_dir", dir));
        }
        let mut config: Config = figment.extract().map_err(Box::new)?;
        if let Ok(value) = std::env::var("SANDCALL_API_KEYS") {
            config.api_keys.extend(parse_env_keys(&value)?);
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad(format!("listen = {:?} is not an address:port", self.listen));
        }
        if self.max_concurrent_runs == 0 {
            return bad("max_concurrent_runs must be at least 1".into());
        }
        if self.max_run_timeout_ms == 0 {
            return bad("max_run_timeout_ms must be above 0".into());
        }
        if self
            .run_timeout_ms
            .is_some_and(|t| t == 0 || t > self.max_run_timeout_ms)
        {
            return bad("run_timeout_ms must be between 1 and max_run_timeout_ms".into());
        }
        if !(self.cpus > 0.0 && self.cpus <= 1024.0) {
            return bad("cpus must be above 0 and at most 1024".into());
        }
        for (name, value) in [
            ("memory_limit_mb", self.memory_limit_mb),
            ("max_processes", self.max_processes),
            ("max_open_files", self.max_open_files),
            ("max_output_bytes", self.max_output_bytes),
            ("cpu_time_limit_ms", self.cpu_time_limit_ms),
            ("workspace_limit_mb", self.workspace_limit_mb),
            ("file_size_limit_mb", self.file_size_limit_mb),
            ("tmp_limit_mb", self.tmp_limit_mb),
            ("max_code_bytes", self.max_code_bytes),
            ("tool_call_timeout_ms", self.tool_call_timeout_ms),
            ("session_expiry_s", self.session_expiry_s),
            ("max_tool_call_bytes", self.max_tool_call_bytes),
            ("max_sessions", self.max_sessions as u64),
            ("max_pause_bytes", self.max_pause_bytes),
            ("max_session_tool_bytes", self.max_session_tool_bytes),
            ("max_tool_result_bytes", self.max_tool_result_bytes),
            ("max_stored_bytes_per_principal", self.max_stored_bytes_per_principal),
            ("max_stored_files_per_principal", self.max_stored_files_per_principal),
            ("file_cache_mb", self.file_cache_mb),
            ("s3_timeout_ms", self.s3_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("keep_alive_timeout_ms", self.keep_alive_timeout_ms),
            ("max_connections", self.max_connections as u64),
            (
                "max_sessions_per_principal",
                self.max_sessions_per_principal.unwrap_or(1) as u64,
            ),
            (
                "max_runs_per_principal",
                self.max_runs_per_principal.unwrap_or(1) as u64,
            ),
        ] {
            if value == 0 {
                return bad(format!("{name} must be above 0"));
            }
        }
        let c = &self.ceilings;
        for (name, default, ceiling) in [
            ("memory_limit_mb", self.memory_limit_mb, c.memory_limit_mb),
            ("max_processes", self.max_processes, c.max_processes),
            ("max_open_files", self.max_open_files, c.max_open_files),
            ("max_output_bytes", self.max_output_bytes, c.max_output_bytes),
            ("cpu_time_limit_ms", self.cpu_time_limit_ms, c.cpu_time_limit_ms),
            ("workspace_limit_mb", self.workspace_limit_mb, c.workspace_limit_mb),
            ("file_size_limit_mb", self.file_size_limit_mb, c.file_size_limit_mb),
        ] {
            if ceiling.is_some_and(|c| c < default) {
                return bad(format!("ceilings.{name} is below the default {name}"));
            }
        }
        for key in &self.api_keys {
            if !valid_principal(&key.principal) {
                return bad(format!(
                    "api_keys: principal {:?} must be 1 to 64 letters, digits, `_-.@`",
                    key.principal
                ));
            }
            if key.sha256.len() != 64 || !key.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(format!(
                    "api_keys: sha256 of {:?} must be 64 hex characters",
                    key.principal
                ));
            }
        }
        if self.max_file_bytes == 0
            || self.max_output_files == 0
            || self.file_ttl_s == 0
            || self.file_sweep_interval_s == 0
        {
            return bad(
                "max_file_bytes, max_output_files, file_ttl_s and file_sweep_interval_s must be above 0".into(),
            );
        }
        if self.sandbox_uid == Some(0) || self.sandbox_gid == Some(0) {
            return bad(
                "sandbox_uid and sandbox_gid may not be 0: the sandbox user must not be the host's root".into(),
            );
        }
        if let Some(secret) = &self.token_secret {
            if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad("token_secret must be 64 hex characters (32 bytes)".into());
            }
        }
        match self.session_store.as_deref() {
            None | Some("embedded") => {}
            Some(url) if url.starts_with("redis://") => {
                if self.node_url.is_none() {
                    return bad(
                        "session_store = redis://... needs node_url: how the other nodes reach this one".into(),
                    );
                }
                if self.token_secret.is_none() {
                    return bad(
                        "session_store = redis://... needs token_secret, the same on every node (a token made by one \
                         node is checked by another)"
                            .into(),
                    );
                }
            }
            Some(other) => {
                return bad(format!(
                    "session_store = {other:?}: expected \"embedded\" or \"redis://host:port/db\""
                ))
            }
        }
        if let Some(url) = &self.node_url {
            let ok = url
                .strip_prefix("http://")
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ']));
            if !ok {
                return bad(format!("node_url = {url:?}: expected http://host:port"));
            }
        }
        if self.node_lease_ms < 300 {
            return bad("node_lease_ms must be at least 300".into());
        }
        for (name, path) in [("python", &self.python), ("bash", &self.bash), ("node", &self.node)]
            .into_iter()
            .chain(self.typescript_transpiler.iter().map(|p| ("typescript_transpiler", p)))
        {
            if !path.is_absolute() {
                return bad(format!("{name} must be an absolute path"));
            }
        }
        if let Some(name) = self
            .warm_languages
            .iter()
            .find(|n| sandcall_api::Language::parse(n).is_none())
        {
            return bad(format!(
                "warm_languages names {name:?}, which is not a language (python, bash, javascript, typescript)"
            ));
        }
        for p in &self.toolchain_path {
            if !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return bad(format!(
                    "toolchain_path entry {} must be absolute, without ..",
                    p.display()
                ));
            }
        }
        self.validate_languages()?;
        for (i, m) in self.mcp_servers.iter().enumerate() {
            if m.name.is_empty() || m.name.chars().any(char::is_control) || m.command.is_empty() {
                return bad(format!("mcp_servers[{i}] needs a name and a command"));
            }
            if self.mcp_servers[..i].iter().any(|o| o.name == m.name) {
                return bad(format!("mcp_servers[{i}]: the name {:?} is taken", m.name));
            }
        }
        for group in [
            crate::rate::Group::Exec,
            crate::rate::Group::Sessions,
            crate::rate::Group::Files,
        ] {
            if let Some(Err(e)) = self.rate_limit_text(group).map(str::parse::<crate::rate::Rate>) {
                return bad(format!("{}: {e}", group.config_key()));
            }
        }
        for m in &self.warm_preload {
            let ok = !m.is_empty()
                && m.split('.').all(|part| {
                    part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if !ok {
                return bad(format!("warm_preload entry {m:?} must be a dotted Python module name"));
            }
        }
        for p in &self.extra_runtime_paths {
            if !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return bad(format!(
                    "extra_runtime_paths entry {} must be absolute, without ..",
                    p.display()
                ));
            }
        }
        Ok(())
    }

    /// API keys or JWT keys are configured: not local mode.
    /// Each declared language has names no other language takes, a plain code file
    /// name, a run command, and absolute paths.
    fn validate_languages(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let mut seen: Vec<String> = Vec::new();
        for (i, l) in self.languages.iter().enumerate() {
            let what = format!("languages[{i}]");
            if l.names.is_empty() {
                return bad(format!("{what} needs at least one name"));
            }
            for name in &l.names {
                let lower = name.trim().to_ascii_lowercase();
                let ok = !lower.is_empty()
                    && lower.len() <= 32
                    && lower.chars().all(|c| c.is_ascii_alphanumeric() || "+-_.#".contains(c));
                if !ok {
                    return bad(format!(
                        "{what}: name {name:?} must be 1 to 32 letters, digits or + - _ . #"
                    ));
                }
                if sandcall_api::Language::parse(&lower).is_some() || seen.contains(&lower) {
                    return bad(format!("{what}: name {name:?} is already a language's name"));
                }
                seen.push(lower);
            }
            let reserved = ["args", "tools.json", "tools.sh", "runner.py", "runner.mjs", "bin"];
            let plain = !l.code_file.is_empty()
                && l.code_file.len() <= 64
                && !l.code_file.starts_with('.')
                && l.code_file
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !plain || reserved.contains(&l.code_file.as_str()) {
                return bad(format!(
                    "{what}: code_file {:?} must be a plain file name (letters, digits, . _ -)",
                    l.code_file
                ));
            }
            if l.run.trim().is_empty() || l.compile.as_ref().is_some_and(|c| c.trim().is_empty()) {
                return bad(format!("{what}: run (and compile, when given) must not be blank"));
            }
            if l.tools
                .iter()
                .any(|t| t.is_empty() || (t.contains('/') && !t.starts_with('/')))
            {
                return bad(format!("{what}: tools are command names or absolute paths"));
            }
            if let Some(p) = l
                .paths
                .iter()
                .find(|p| !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)))
            {
                return bad(format!("{what}: path {} must be absolute, without ..", p.display()));
            }
        }
        if self.languages.len() > usize::from(u16::MAX) {
            return bad("too many languages".into());
        }
        Ok(())
    }

    pub fn has_credentials(&self) -> bool {
        !self.api_keys.is_empty() || self.jwt.has_key_source()
    }

    /// The default wall-clock budget of a run, in ms.
    pub fn default_run_timeout_ms(&self) -> u64 {
        self.run_timeout_ms.unwrap_or(self.max_run_timeout_ms)
    }

    /// How many runs may wait for a slot.
    pub fn queue_length(&self) -> usize {
        self.max_queued_runs.unwrap_or(self.max_concurrent_runs * 4)
    }

    /// Sessions one principal may hold at once (`max_sessions_per_principal`).
    pub fn sessions_per_principal(&self) -> usize {
        let default = if !self.has_credentials() {
            self.max_sessions
        } else {
            (self.max_sessions / 4).max(1)
        };
        self.max_sessions_per_principal.unwrap_or(default)
    }

    /// The rate of a group of routes, as written (`rate_limit_*`).
    fn rate_limit_text(&self, group: crate::rate::Group) -> Option<&str> {
        use crate::rate::Group;
        match group {
            Group::Exec => self.rate_limit_exec.as_deref(),
            Group::Sessions => self.rate_limit_sessions.as_deref(),
            Group::Files => self.rate_limit_files.as_deref(),
        }
    }

    /// The rate of a group of routes, if it has one (checked by `validate`).
    pub fn rate_limit(&self, group: crate::rate::Group) -> Option<crate::rate::Rate> {
        self.rate_limit_text(group)?.parse().ok()
    }

    /// Runs one principal may have running or queued (`max_runs_per_principal`).
    pub fn runs_per_principal(&self) -> usize {
        let default = if !self.has_credentials() {
            usize::MAX
        } else {
            (self.max_concurrent_runs / 2).max(1)
        };
        self.max_runs_per_principal.unwrap_or(default)
    }

    /// The request body limit: code and stdin at their maxima, plus room for the rest.
    pub fn max_body_bytes(&self) -> usize {
        (self.max_code_bytes + self.max_stdin_bytes + (1 << 20)) as usize
    }

    /// The body limit of `POST /v1/exec/programmatic`: a resume may carry three results
    /// of `max_tool_result_bytes` (more at once go in parts: a resume may answer some
    /// of the pending calls), and never less than any other JSON route.
    pub fn max_programmatic_body_bytes(&self) -> usize {
        let results = self.max_tool_result_bytes.saturating_mul(3).saturating_add(1 << 20);
        self.max_body_bytes()
            .max(usize::try_from(results).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_servers_need_a_name_and_a_command_and_unique_names() {
        let server = |name: &str, command: &str| McpServerConfig {
            name: name.into(),
            command: command.into(),
            ..Default::default()
        };
        let mut c = Config {
            mcp_servers: vec![server("weather", "/bin/weather"), server("files", "files-mcp")],
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.mcp_servers.push(server("weather", "/bin/other"));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("mcp_servers[2]") && e.contains("taken"), "{e}");
        c.mcp_servers = vec![server("", "/bin/x")];
        assert!(c.validate().is_err());
        c.mcp_servers = vec![server("x", "")];
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_redis_session_store_needs_a_node_url_and_a_shared_token_secret() {
        let secret = "ab".repeat(32);
        let with = |store: Option<&str>, node: Option<&str>, secret: Option<&str>| {
            Config {
                session_store: store.map(str::to_owned),
                node_url: node.map(str::to_owned),
                token_secret: secret.map(str::to_owned),
                ..Config::default()
            }
            .validate()
        };
        assert!(with(None, None, None).is_ok());
        assert!(with(Some("embedded"), None, None).is_ok());
        let redis = Some("redis://127.0.0.1:6379/0");
        assert!(with(redis, Some("http://10.0.0.1:8080"), Some(&secret)).is_ok());
        for (store, node, secret, says) in [
            (redis, None, Some(secret.as_str()), "node_url"),
            (redis, Some("http://10.0.0.1:8080"), None, "token_secret"),
            (Some("memcached://x"), None, None, "session_store"),
            (None, Some("10.0.0.1:8080"), None, "node_url"),
            (None, Some("http://10.0.0.1:8080/path"), None, "node_url"),
        ] {
            let err = with(store, node, secret).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn defaults_match_the_documented_table() {
        let c = Config::default();
        assert_eq!(c.listen, "127.0.0.1:3112");
        assert_eq!(c.max_run_timeout_ms, 300_000);
        assert_eq!(c.max_output_bytes, 65_536);
        assert_eq!(c.memory_limit_mb, 512);
        assert_eq!(c.max_processes, 128);
        assert_eq!(c.workspace_limit_mb, 256);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn warm_languages_must_name_languages() {
        let mut c = Config::default();
        assert_eq!(c.warm_languages, ["python", "bash", "javascript", "typescript"]);
        c.warm_languages = vec!["js".into(), "PY".into()];
        assert!(c.validate().is_ok());
        c.warm_languages = vec!["python".into(), "cobol".into()];
        assert!(c.validate().is_err());
    }

    #[test]
    fn declared_languages_are_checked() {
        let awk = LanguageConfig {
            names: vec!["awk".into()],
            code_file: "main.awk".into(),
            run: "awk -f \"$CODE\"".into(),
            ..LanguageConfig::default()
        };
        let check = |l: LanguageConfig| {
            let c = Config {
                languages: vec![l],
                ..Config::default()
            };
            c.validate().map_err(|e| e.to_string())
        };
        assert!(check(awk.clone()).is_ok());
        for (bad, why) in [
            (
                LanguageConfig {
                    names: vec![],
                    ..awk.clone()
                },
                "at least one name",
            ),
            (
                LanguageConfig {
                    names: vec!["rs".into()],
                    ..awk.clone()
                },
                "already a language's name",
            ),
            (
                LanguageConfig {
                    names: vec!["a b".into()],
                    ..awk.clone()
                },
                "letters, digits",
            ),
            (
                LanguageConfig {
                    code_file: "../x".into(),
                    ..awk.clone()
                },
                "plain file name",
            ),
            (
                LanguageConfig {
                    code_file: "runner.py".into(),
                    ..awk.clone()
                },
                "plain file name",
            ),
            (
                LanguageConfig {
                    run: " ".into(),
                    ..awk.clone()
                },
                "must not be blank",
            ),
            (
                LanguageConfig {
                    compile: Some("".into()),
                    ..awk.clone()
                },
                "must not be blank",
            ),
            (
                LanguageConfig {
                    tools: vec!["bin/awk".into()],
                    ..awk.clone()
                },
                "absolute paths",
            ),
            (
                LanguageConfig {
                    paths: vec!["opt/x".into()],
                    ..awk.clone()
                },
                "must be absolute",
            ),
        ] {
            let err = check(bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        // Two languages may not share a name.
        let c = Config {
            languages: vec![
                awk.clone(),
                LanguageConfig {
                    names: vec!["AWK".into()],
                    ..awk
                },
            ],
            ..Config::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("already a language's name"));
        let c = Config {
            toolchain_path: vec!["usr/bin".into()],
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn warm_preload_takes_module_names_only() {
        let mut c = Config::default();
        assert_eq!(c.warm_preload, ["numpy", "pandas", "matplotlib.pyplot"]);
        assert!(c.validate().is_ok());
        for bad in ["", "os; import x", "a..b", "1abc", "a-b", ".a"] {
            c.warm_preload = vec![bad.into()];
            assert!(c.validate().is_err(), "{bad:?} accepted");
        }
        c.warm_preload = vec!["scipy.stats".into(), "_x1".into()];
        assert!(c.validate().is_ok());
        c.warm_preload = Vec::new();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../../../docs/configuration.md");
        for key in known_keys() {
            assert!(
                doc.contains(&format!("`{key}`")),
                "docs/configuration.md does not describe `{key}`"
            );
        }
        let jwt = serde_json::to_value(JwtConfig::default()).unwrap();
        for key in jwt.as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("`jwt.{key}`")),
                "docs/configuration.md does not describe `jwt.{key}`"
            );
        }
        for (var, _) in CODEAPI_JWT_ENV {
            assert!(doc.contains(var), "docs/configuration.md does not name {var}");
        }
        let ceilings = serde_json::to_value(Ceilings::default()).unwrap();
        for key in ceilings.as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("`ceilings.{key}`")),
                "docs/configuration.md does not describe `ceilings.{key}`"
            );
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn file_then_env_then_flags() {
        let dir = std::env::temp_dir().join(format!("sandcall-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "memory_limit_mb = 256\nmax_processes = 64\nlisten = \"127.0.0.1:9\"\n[ceilings]\nmemory_limit_mb = 1024\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("SANDCALL_MAX_PROCESSES", "32");
            jail.set_env("SANDCALL_LOG", "debug");
            let c = Config::load(
                Some(&file),
                &Overrides {
                    listen: Some("127.0.0.1:7".into()),
                    data_dir: None,
                },
            )
            .map_err(|e| e.to_string())?;
            assert_eq!(c.memory_limit_mb, 256);
            assert_eq!(c.max_processes, 32);
            assert_eq!(c.listen, "127.0.0.1:7");
            assert_eq!(c.ceilings.memory_limit_mb, Some(1024));
            Ok(())
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn programmatic_timeout_scope_and_result_size() {
        let c = Config::default();
        assert_eq!(c.programmatic_timeout_scope, TimeoutScope::Run);
        assert_eq!(c.max_tool_result_bytes, 5 << 20);
        // Three results of 5 MiB and room for the rest.
        assert_eq!(c.max_programmatic_body_bytes(), 16 << 20);
        figment::Jail::expect_with(|jail| {
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "loop");
            jail.set_env("SANDCALL_MAX_TOOL_RESULT_BYTES", "1024");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.programmatic_timeout_scope, TimeoutScope::Loop);
            // Never below the other JSON routes' limit.
            assert_eq!(c.max_programmatic_body_bytes(), c.max_body_bytes());
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "forever");
            assert!(Config::load(None, &Overrides::default()).is_err());
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "run");
            jail.set_env("SANDCALL_MAX_TOOL_RESULT_BYTES", "0");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("max_tool_result_bytes"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_in_the_file_are_refused() {
        let dir = std::env::temp_dir().join(format!("sandcall-config-typo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "memory_limt_mb = 256\n").unwrap();
        let err = Config::load(Some(&file), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory_limt_mb"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lowering_the_timeout_ceiling_alone_lowers_the_default() {
        let c = Config {
            max_run_timeout_ms: 1000,
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        assert_eq!(c.default_run_timeout_ms(), 1000);
        let c = Config {
            max_concurrent_runs: 3,
            ..Config::default()
        };
        assert_eq!(c.queue_length(), 12);
    }

    #[test]
    fn env_keys_are_hashed_and_checked() {
        let keys = parse_env_keys("alice:key-a-1234567890, bob:key-b-1234567890").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].principal, "alice");
        assert_eq!(keys[0].sha256, key_hash("key-a-1234567890"));
        assert!(!keys[0].sha256.contains("key-a"));
        assert!(parse_env_keys("alice").is_err());
        assert!(parse_env_keys("alice:short").is_err());
        assert!(parse_env_keys("bad name:key-a-1234567890").is_err());
    }

    #[test]
    fn added_keys_are_stored_as_hashes() {
        let dir = std::env::temp_dir().join(format!("sandcall-keys-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "memory_limit_mb = 256\n").unwrap();
        let key = add_key(&file, "alice").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&key));
        let c = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.memory_limit_mb, 256);
        assert_eq!(
            c.api_keys,
            vec![ApiKey {
                principal: "alice".into(),
                sha256: key_hash(&key)
            }]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn jwt_settings_from_the_file_and_the_codeapi_variables() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "[jwt]\nissuer = \"from-file\"\naudience = \"file-aud\"\nallowed_algs = [\"EdDSA\"]\n",
            )?;
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.jwt.issuer, "from-file");
            assert_eq!(c.jwt.allowed_algs, ["EdDSA"]);
            assert!(!c.has_credentials(), "no key source yet");
            let jwks = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "abc", "kid": "k1"}]}"#;
            let pem = "-----BEGIN PUBLIC KEY-----\\nMCowBQYDK2VwAyEA\\n-----END PUBLIC KEY-----";
            jail.set_env("CODEAPI_JWT_JWKS_JSON", jwks);
            jail.set_env("CODEAPI_JWT_PUBLIC_KEY", pem);
            jail.set_env("CODEAPI_JWT_KEY_ID", "old-name");
            jail.set_env("CODEAPI_JWT_KID", "2026");
            jail.set_env("CODEAPI_JWT_ALLOWED_ALGS", "EdDSA, HS256");
            jail.set_env("CODEAPI_JWT_ISSUER", "from-env");
            jail.set_env("CODEAPI_JWT_CLOCK_SKEW_SECONDS", "5");
            jail.set_env("CODEAPI_JWT_HS256_SECRET", "");
            jail.set_env("SANDCALL_JWT__AUDIENCE", "sandcall-aud");
            jail.set_env("SANDCALL_JWT__MAX_TTL_SECONDS", "60");
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.jwt.jwks_json.as_deref(), Some(jwks), "JSON text is kept as text");
            assert_eq!(c.jwt.public_key.as_deref(), Some(pem));
            assert_eq!(c.jwt.kid.as_deref(), Some("2026"), "a number-like kid stays text");
            assert_eq!(c.jwt.allowed_algs, ["EdDSA", "HS256"]);
            assert_eq!(c.jwt.issuer, "from-env", "the environment wins over the file");
            assert_eq!(c.jwt.audience, "sandcall-aud", "SANDCALL_JWT__<KEY> works too");
            assert_eq!(c.jwt.max_ttl_seconds, 60);
            assert_eq!(c.jwt.clock_skew_seconds, 5);
            assert_eq!(c.jwt.hs256_secret, None, "an empty variable is unset");
            assert!(c.has_credentials());
            assert_eq!(c.sessions_per_principal(), (c.max_sessions / 4).max(1));
            jail.set_env("CODEAPI_JWT_MAX_TTL_SECONDS", "five minutes");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("CODEAPI_JWT_MAX_TTL_SECONDS"), "{err}");
            jail.set_env("CODEAPI_JWT_MAX_TTL_SECONDS", "300");
            jail.set_env("CODEAPI_JWT_TRUST_ENTRIES_JSON", "[]");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("CODEAPI_JWT_TRUST_ENTRIES_JSON"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn ceilings_below_defaults_are_refused() {
        let mut c = Config::default();
        c.ceilings.memory_limit_mb = Some(100);
        assert!(c.validate().is_err());
    }
}
