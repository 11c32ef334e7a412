// LibreChat's JWTs: a token sandcall cannot verify is a 401 that the client
// shows as such, and each LibreChat user (the token's tenant_id and sub) sees
// only their own files.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createCodeExecutionTool, fetchSessionFiles } from '@librechat/agents';
import {
  baseUrl,
  download,
  expiredToken,
  foreignToken,
  injected,
  invoke,
  listFull,
  postJson,
  upload,
  user,
} from '../lib/librechat.mjs';

const NOT_AUTHORIZED = /Code execution is not authorized\. Verify access before trying again\./;

/** A client whose every request carries `token`. */
const withToken = (token) => createCodeExecutionTool({ user_id: 'e2e-auth', authHeaders: async () => ({ Authorization: `Bearer ${token}` }) });

function assertUnauthorized(raw, what) {
  assert.equal(raw.status, 401, `${what}: ${JSON.stringify(raw.body)}`);
  assert.equal(typeof raw.body.error, 'string', `${what}: the error shape`);
  assert.equal(typeof raw.body.error_type, 'string', `${what}: the error shape`);
}

test('a token signed by another key is refused with 401, shown to the model as not authorized', { timeout: 60_000 }, async () => {
  const token = foreignToken('e2e-auth-mallory');
  assertUnauthorized(
    await postJson(`${baseUrl}/exec`, { lang: 'py', code: 'print(1)' }, { Authorization: `Bearer ${token}` }),
    'POST /exec with a foreign token',
  );
  await assert.rejects(invoke(withToken(token), { lang: 'py', code: 'print(1)' }), (error) => {
    assert.match(error.message, NOT_AUTHORIZED);
    return true;
  });
});

test('an expired token is refused with 401, shown to the model as not authorized', { timeout: 60_000 }, async () => {
  const token = expiredToken('e2e-auth-dave');
  assertUnauthorized(
    await postJson(`${baseUrl}/exec`, { lang: 'py', code: 'print(1)' }, { Authorization: `Bearer ${token}` }),
    'POST /exec with an expired token',
  );
  await assert.rejects(invoke(withToken(token), { lang: 'py', code: 'print(1)' }), (error) => {
    assert.match(error.message, NOT_AUTHORIZED);
    return true;
  });
});

test('two LibreChat users (different sub) cannot see each other\'s files', { timeout: 60_000 }, async () => {
  const erin = user('e2e-auth-erin');
  const frank = user('e2e-auth-frank');

  const up = await upload(erin, { name: 'secret.txt', content: 'erin only\n', type: 'text/plain' });
  const tool = createCodeExecutionTool({ user_id: erin.sub, authHeaders: erin.authHeaders });
  const { artifact } = await invoke(
    tool,
    { lang: 'py', code: "open('copy.txt', 'w').write(open('secret.txt').read())" },
    { _injected_files: [injected({ id: up.file_id, name: 'secret.txt', storage_session_id: up.storage_session_id })] },
  );
  const copy = (artifact.files ?? []).find((f) => f.name === 'copy.txt');
  assert.ok(copy, `copy.txt among Erin's outputs: ${JSON.stringify(artifact.files)}`);
  const copySession = copy.storage_session_id ?? artifact.session_id;

  // Erin reaches her files.
  assert.equal((await download(erin, up.storage_session_id, up.file_id)).status, 200);
  assert.equal((await download(erin, copySession, copy.id)).bytes.toString(), 'erin only\n');

  // Frank does not: not the upload, not the output, not their lists.
  for (const [session, file] of [[up.storage_session_id, up.file_id], [copySession, copy.id]]) {
    const got = await download(frank, session, file);
    assert.equal(got.status, 404, `Frank downloading Erin's ${file}: ${got.status} ${got.bytes.toString().slice(0, 200)}`);
    const listed = await listFull(frank, session);
    assert.ok(
      listed.status === 404 || (listed.status === 200 && Array.isArray(listed.body) && listed.body.length === 0),
      `Frank listing Erin's session: ${listed.status} ${JSON.stringify(listed.body)}`,
    );
    const files = await fetchSessionFiles(frank.baseUrl, session, { kind: 'user', id: frank.sub }, frank.authHeaders);
    assert.deepEqual(files, [], 'fetchSessionFiles finds nothing for Frank');
  }

  // Nor can Frank's runs read Erin's upload.
  const raw = await postJson(
    `${baseUrl}/exec`,
    { lang: 'py', code: "print(open('secret.txt').read())", files: [injected({ id: up.file_id, name: 'secret.txt', storage_session_id: up.storage_session_id })] },
    frank.headers(),
  );
  assert.equal(raw.status, 404, `Frank's run with Erin's file: ${JSON.stringify(raw.body)}`);
  assert.equal(raw.body.error_type, 'file_not_found');
});
