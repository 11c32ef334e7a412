// What LibreChat's server does around the client's tools, reproduced from its
// source: the Code API base URL and JWT per user, its file requests (upload,
// batch upload, download, the object-metadata freshness check), and how its
// ToolNode hands a tool call the conversation's code session and files.
// The tools themselves are @librechat/agents' own, unchanged.
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { DEFAULT_KID, loadPrivateKey, mintToken } from './jwt.mjs';

function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run the suite through e2e/librechat/run.sh`);
  }
  return value;
}

/** The base URL of the server with JWTs on (what LIBRECHAT_CODE_BASEURL points at). */
export const baseUrl = required('LIBRECHAT_CODE_BASEURL');
/** A second server, started with allow_unauthenticated: LibreChat with JWT off sends nothing. */
export const openBaseUrl = required('E2E_OPEN_BASEURL');
/** A third server, as the first with `execution_profile = "stateful"`. */
export const statefulBaseUrl = required('E2E_STATEFUL_BASEURL');
const privateKey = loadPrivateKey(required('E2E_JWT_PRIVATE_KEY_FILE'));
const kid = process.env.E2E_JWT_KID ?? DEFAULT_KID;

/** A token for LibreChat user `sub`, as LibreChat mints it. */
export function tokenFor(sub, options = {}) {
  return mintToken({ privateKey, kid, sub, ...options });
}

/** `Authorization: Bearer <JWT>` for user `sub`, freshly minted. */
export function authHeadersFor(sub) {
  return { Authorization: `Bearer ${tokenFor(sub)}` };
}

/** A token signed by a key sandcall does not know, under the configured kid. */
export function foreignToken(sub) {
  const { privateKey: other } = generateKeyPairSync('ed25519');
  return mintToken({ privateKey: other, kid, sub });
}

/** An expired token: issued 10 minutes ago for 300 s, well past any clock skew. */
export function expiredToken(sub) {
  return tokenFor(sub, { now: Math.floor(Date.now() / 1000) - 600, ttlSeconds: 300 });
}

/**
 * One LibreChat user as the tools see them. LibreChat builds its tools with
 * `authHeaders` as a function, so every request gets a token minted for it.
 */
export function user(sub, { url = baseUrl, jwt = true } = {}) {
  return {
    sub,
    baseUrl: url,
    authHeaders: jwt ? () => authHeadersFor(sub) : undefined,
    headers: () => (jwt ? authHeadersFor(sub) : {}),
  };
}

const UA = { 'User-Agent': 'LibreChat/1.0' };

/** fetch, with the request named when the connection itself fails (e.g. a route the server refuses before reading the body). */
async function send(url, init) {
  try {
    return await fetch(url, init);
  } catch (error) {
    throw new Error(`${init?.method ?? 'GET'} ${url}: no answer (${error.cause?.code ?? error.message})`, { cause: error });
  }
}

async function json(response, what) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    assert.fail(`${what}: HTTP ${response.status}, not JSON: ${text.slice(0, 300)}`);
  }
}

function appendIdentity(form, { kind, id, version }) {
  form.append('kind', kind);
  form.append('id', id);
  if (version != null) form.append('version', String(version));
}

function appendFile(form, { name, content, type = 'application/octet-stream' }) {
  // LibreChat appends a nested name (`skill/scripts/run.py`) as the part's
  // filename with its folders (form-data's `filepath`); so does this.
  form.append('file', new Blob([content], { type }), name);
}

/**
 * LibreChat's `uploadCodeEnvFile`: one file, multipart with `kind`, `id`,
 * `version?` and `file`; headers User-Agent, User-Id and the JWT.
 * Returns the raw response and its JSON.
 */
export async function uploadRaw(u, file, identity = { kind: 'user', id: u.sub }) {
  const form = new FormData();
  appendIdentity(form, identity);
  appendFile(form, file);
  const response = await send(`${u.baseUrl}/upload`, {
    method: 'POST',
    headers: { ...UA, 'User-Id': u.sub, ...u.headers() },
    body: form,
  });
  return { status: response.status, body: await json(response, 'upload') };
}

/** An upload that must succeed: `{storage_session_id, file_id, body}`, as LibreChat reads it. */
export async function upload(u, file, identity) {
  const { status, body } = await uploadRaw(u, file, identity);
  assert.equal(status, 200, `upload answered ${status}: ${JSON.stringify(body)}`);
  assert.equal(body.message, 'success', `upload message: ${JSON.stringify(body)}`);
  assert.ok(body.storage_session_id, `upload without storage_session_id: ${JSON.stringify(body)}`);
  assert.ok(body.files?.[0]?.fileId, `upload without files[0].fileId: ${JSON.stringify(body)}`);
  return { storage_session_id: body.storage_session_id, file_id: body.files[0].fileId, body };
}

/**
 * LibreChat's `batchUploadCodeEnvFiles`: `kind`, `id`, `version?`,
 * `read_only` (only when true) and one `file` part per file, to /upload/batch.
 */
export async function batchUploadRaw(u, files, { identity = { kind: 'user', id: u.sub }, readOnly = false } = {}) {
  const form = new FormData();
  appendIdentity(form, identity);
  if (readOnly) form.append('read_only', 'true');
  for (const file of files) appendFile(form, file);
  const response = await send(`${u.baseUrl}/upload/batch`, {
    method: 'POST',
    headers: { ...UA, 'User-Id': u.sub, ...u.headers() },
    body: form,
  });
  return { status: response.status, body: await json(response, 'batch upload') };
}

function identityQuery({ kind, id, version }) {
  const query = new URLSearchParams({ kind, id });
  if (version != null) query.set('version', String(version));
  return `?${query}`;
}

/** LibreChat's `getCodeOutputDownloadStream`: GET /download/{session}/{file}?kind=user&id=... */
export async function download(u, sessionId, fileId, identity = { kind: 'user', id: u.sub }) {
  const response = await send(`${u.baseUrl}/download/${sessionId}/${fileId}${identityQuery(identity)}`, {
    headers: { ...UA, ...u.headers() },
  });
  return { status: response.status, bytes: Buffer.from(await response.arrayBuffer()) };
}

/** LibreChat's `getCodeFileInfo` (the freshness check): GET /sessions/{session}/objects/{file}?kind=... */
export async function objectInfo(u, sessionId, fileId, identity = { kind: 'user', id: u.sub }) {
  const response = await send(
    `${u.baseUrl}/sessions/${sessionId}/objects/${fileId}${identityQuery(identity)}`,
    { headers: { ...UA, ...u.headers() } },
  );
  return { status: response.status, body: await json(response, 'object info') };
}

/** The list request of the client's `fetchSessionFiles`, raw: GET /files/{session}?detail=full&kind=user&id=... */
export async function listFull(u, sessionId, identity = { kind: 'user', id: u.sub }) {
  const query = new URLSearchParams({ detail: 'full', kind: identity.kind, id: identity.id });
  const response = await send(`${u.baseUrl}/files/${encodeURIComponent(sessionId)}?${query}`, {
    headers: { ...UA, ...u.headers() },
  });
  return { status: response.status, body: await json(response, 'list') };
}

/** A JSON POST with the given headers, for the checks that need the raw answer. */
export async function postJson(url, body, headers = {}) {
  const response = await send(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...UA, ...headers },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: await json(response, `POST ${url}`) };
}

/**
 * `{id, resource_id, name, storage_session_id, kind}`: a file as LibreChat's ToolNode
 * injects it. `resource_id` is the owning resource (a skill's id), else the file's id.
 */
export function injected({ id, name, storage_session_id, kind = 'user', version, resource_id = id }) {
  const ref = { id, resource_id, name, storage_session_id, kind };
  if (kind === 'skill' && version != null) ref.version = version;
  return ref;
}

let callCounter = 0;

/**
 * Invokes a client tool the way LibreChat's ToolNode does: a tool call whose
 * extra fields (`session_id`, `_injected_files`, and for the programmatic
 * tools `toolMap`/`toolDefs`) reach the tool as `config.toolCall`.
 * Resolves to `{content, artifact}`; rejects with the client's own error.
 */
export async function invoke(tool, args, extra = {}, config = {}) {
  callCounter += 1;
  const message = await tool.invoke(
    { id: `call_${callCounter}`, name: tool.name, args, type: 'tool_call', ...extra },
    config,
  );
  return { content: message.content, artifact: message.artifact };
}

/**
 * The conversation's code session as LibreChat's ToolNode keeps it: the last
 * run's session id and the files a later call gets injected. Files that come
 * back replace files of the same name; the others stay.
 */
export class CodeSession {
  constructor(files = []) {
    this.session_id = undefined;
    this.files = files.map((f) => ({ ...f }));
  }

  /** The extra tool-call fields for the next call. */
  extra() {
    if (!this.session_id && this.files.length === 0) return {};
    const extra = {};
    if (this.session_id) extra.session_id = this.session_id;
    if (this.files.length > 0) {
      extra._injected_files = this.files.map((f) =>
        injected({ ...f, storage_session_id: f.storage_session_id ?? this.session_id }),
      );
    }
    return extra;
  }

  /** Takes in a run's artifact (`{session_id, files?}`). */
  update(artifact) {
    assert.ok(artifact?.session_id, `the tool's artifact has no session_id: ${JSON.stringify(artifact)}`);
    const incoming = (artifact.files ?? []).map((f) => ({
      ...f,
      storage_session_id: f.storage_session_id ?? artifact.session_id,
    }));
    const names = new Set(incoming.map((f) => f.name));
    this.files = [...this.files.filter((f) => !names.has(f.name)), ...incoming];
    this.session_id = artifact.session_id;
  }
}

/** A LangChain tool the program may call, as LibreChat's agents define them. */
export async function langchainTool(name, description, parameters, fn) {
  const { tool } = await import('@langchain/core/tools');
  return tool(fn, { name, description, schema: parameters });
}

/**
 * The extra tool-call fields ToolNode adds for run_tools_with_code / run_tools_with_bash:
 * the tools, and their definitions (what the client sends). `parameters` replaces a
 * definition's schema by tool name, for definitions that differ from the tool's own.
 */
export function programmaticExtra(tools, parameters = {}) {
  return {
    toolMap: new Map(tools.map((t) => [t.name, t])),
    toolDefs: tools.map((t) => ({ name: t.name, description: t.description, parameters: parameters[t.name] ?? t.schema })),
  };
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
