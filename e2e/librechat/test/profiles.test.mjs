// LibreChat's execution profiles: the client's stateful sessions (`statefulSessions`,
// `executionProfile: "stateful"`, a `runtimeSessionHint` per conversation) against the
// "stateful" server, each profile's client against the other profile's server, and
// what the model reads when a programmatic run times out or its token is mangled.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import {
  createBashExecutionTool,
  createBashProgrammaticToolCallingTool,
  createCodeExecutionTool,
  createProgrammaticToolCallingTool,
} from '@librechat/agents';
import {
  baseUrl,
  injected,
  invoke,
  langchainTool,
  postJson,
  programmaticExtra,
  statefulBaseUrl,
  upload,
  user,
} from '../lib/librechat.mjs';

const dana = user('e2e-profiles-dana', { url: statefulBaseUrl });
const erin = user('e2e-profiles-erin', { url: statefulBaseUrl });

/** The tools of one conversation, as LibreChat builds them for a stateful deployment. */
function conversation(u, hint, profile = 'stateful') {
  const params = {
    baseUrl: u.baseUrl,
    authHeaders: u.authHeaders,
    statefulSessions: true,
    executionProfile: profile,
    runtimeSessionHint: hint,
  };
  return {
    code: createCodeExecutionTool(params),
    bash: createBashExecutionTool(params),
    programmatic: createProgrammaticToolCallingTool(params),
    bashProgrammatic: createBashProgrammaticToolCallingTool(params),
  };
}

test('stateful: a file written in one call is read in the next call of the conversation, and not in another conversation', { timeout: 90_000 }, async () => {
  const one = conversation(dana, 'v2:conversation:0a1b2c3d');
  const first = await invoke(one.code, { lang: 'py', code: 'open("notes.txt", "w").write("kept between calls\\n")\nprint("written")' });
  assert.match(first.content, /stdout:\nwritten/);
  assert.equal(first.artifact.runtime_status, 'new', JSON.stringify(first.artifact));
  assert.match(first.artifact.runtime_session_id ?? '', /^[0-9a-f]{32}$/, JSON.stringify(first.artifact));

  const second = await invoke(one.bash, { command: 'cat notes.txt' });
  assert.match(second.content, /stdout:\nkept between calls/);
  assert.equal(second.artifact.runtime_status, 'reused');
  assert.equal(second.artifact.runtime_session_id, first.artifact.runtime_session_id);

  // Another conversation of the same user, and the same hint of another user.
  for (const other of [conversation(dana, 'v2:conversation:ffffeeee'), conversation(erin, 'v2:conversation:0a1b2c3d')]) {
    const r = await invoke(other.bash, { command: 'ls notes.txt 2>&1 || echo absent' });
    assert.match(r.content, /absent/);
    assert.notEqual(r.artifact.runtime_session_id, first.artifact.runtime_session_id);
  }
});

test('stateful: a file the run deletes comes back in deleted_files, and is gone from the next call', { timeout: 90_000 }, async () => {
  const conv = conversation(dana, 'v2:conversation:de1e7e');
  await invoke(conv.bash, { command: 'echo draft > draft.txt; echo final > final.txt' });
  // An uploaded input too, injected as LibreChat's ToolNode does.
  const up = await upload(dana, { name: 'upload.csv', content: 'a,b\n1,2\n' });
  const removed = await invoke(
    conv.bash,
    { command: 'rm draft.txt upload.csv; echo done' },
    { _injected_files: [injected({ id: up.file_id, name: 'upload.csv', storage_session_id: up.storage_session_id })] },
  );
  assert.match(removed.content, /stdout:\ndone/);
  assert.deepEqual([...(removed.artifact.deleted_files ?? [])].sort(), ['draft.txt', 'upload.csv'], JSON.stringify(removed.artifact));
  const after = await invoke(conv.bash, { command: 'ls' });
  assert.match(after.content, /stdout:\nfinal\.txt(?:\n|$)/);
});

test('LibreChat\'s pre-warm of a conversation answers at once, even while a run of the conversation holds its files', { timeout: 60_000 }, async () => {
  const hint = 'v2:conversation:5a5a5a';
  const conv = conversation(dana, hint);
  const long = invoke(conv.bash, { command: 'sleep 4; echo done > out.txt' });
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const headers = { ...dana.headers(), 'X-CodeAPI-Expected-Profile': 'stateful' };
  const started = Date.now();
  const warm = await postJson(`${statefulBaseUrl}/exec`, { lang: 'bash', code: 'true', runtime_session_hint: hint }, headers);
  const took = Date.now() - started;
  assert.equal(warm.status, 200, JSON.stringify(warm.body));
  assert.equal(warm.body.status, 'ok');
  assert.match(warm.body.runtime_session_id ?? '', /^[0-9a-f]{32}$/);
  // The run still holds the conversation for about 3 s: the pre-warm did not wait for it.
  assert.ok(took < 2000, `the pre-warm took ${took} ms`);
  const done = await long;
  assert.equal(done.artifact.runtime_session_id, warm.body.runtime_session_id);
});

test('a default client against the stateful server, and a stateful client against a default server: 409, and the tool tells the model', { timeout: 60_000 }, async () => {
  const checks = [
    [conversation(dana, 'v2:conversation:1').code, statefulBaseUrl, 'default'],
    [conversation(user('e2e-profiles-fay'), 'v2:conversation:1', 'stateful').code, baseUrl, 'stateful'],
  ];
  for (const [, url, expected] of checks) {
    const raw = await postJson(`${url}/exec`, { lang: 'py', code: 'print(1)' }, {
      ...user('e2e-profiles-raw', { url }).headers(),
      'X-CodeAPI-Expected-Profile': expected,
    });
    assert.equal(raw.status, 409, JSON.stringify(raw.body));
    assert.equal(raw.body.error, 'execution_profile_mismatch');
  }
  const defaultClient = createCodeExecutionTool({ baseUrl: statefulBaseUrl, authHeaders: dana.authHeaders, executionProfile: 'default' });
  const statefulClient = checks[1][0];
  for (const tool of [defaultClient, statefulClient]) {
    await assert.rejects(invoke(tool, { lang: 'py', code: 'print(1)' }), (error) => {
      assert.match(error.message, /does not provide the requested execution profile/);
      assert.match(error.message, /Do not retry this tool in this environment/);
      return true;
    });
  }
});

const carol = user('e2e-profiles-carol');

async function echoTool() {
  return langchainTool(
    'echo_value',
    'Echoes a value',
    { type: 'object', properties: { value: { type: 'string' } }, required: ['value'] },
    async ({ value }) => ({ value }),
  );
}

test('a programmatic run past its timeout reaches the model as "exceeded the time limit"', { timeout: 90_000 }, async () => {
  const tool = createProgrammaticToolCallingTool({ authHeaders: carol.authHeaders });
  await assert.rejects(
    invoke(tool, { code: 'print(await echo_value(value="x"))\nimport time\ntime.sleep(30)', timeout: 2000 }, programmaticExtra([await echoTool()])),
    (error) => {
      assert.match(error.message, /Code execution failed\. Execution exceeded the time limit\./);
      assert.match(error.message, /\[sandbox\] Time limit exceeded/, 'the stderr line is still shown');
      return true;
    },
  );
});

/**
 * A proxy to the jwt server that changes one character of every continuation token
 * it passes back: the client then resumes with a token that does not verify.
 */
async function manglingProxy() {
  const target = new URL(baseUrl);
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers['content-length'];
    const upstream = await fetch(`${target.origin}${req.url}`, {
      method: req.method,
      headers,
      body: req.method === 'GET' ? undefined : Buffer.concat(chunks),
    });
    let text = await upstream.text();
    try {
      const body = JSON.parse(text);
      if (typeof body.continuation_token === 'string') {
        const t = body.continuation_token;
        body.continuation_token = t.slice(0, -2) + (t.at(-2) === 'A' ? 'B' : 'A') + t.at(-1);
        text = JSON.stringify(body);
      }
    } catch {}
    res.writeHead(upstream.status, { 'Content-Type': upstream.headers.get('content-type') ?? 'application/json' });
    res.end(text);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, url: `http://127.0.0.1:${server.address().port}${target.pathname}` };
}

test('a mangled continuation token reaches the model as a rejected request, not an authorization failure', { timeout: 90_000 }, async () => {
  const proxy = await manglingProxy();
  try {
    const tool = createProgrammaticToolCallingTool({ baseUrl: proxy.url, authHeaders: carol.authHeaders });
    await assert.rejects(
      invoke(tool, { code: 'print(await echo_value(value="x"))' }, programmaticExtra([await echoTool()])),
      (error) => {
        assert.match(error.message, /The code execution request was rejected/);
        assert.doesNotMatch(error.message, /not authorized/);
        return true;
      },
    );
  } finally {
    proxy.server.close();
  }
});

test('stateful: a file written by a programmatic call, around a tool call, is read by the next calls of the conversation, and not in another conversation', { timeout: 120_000 }, async () => {
  const hint = 'v2:conversation:9e9e9e';
  const conv = conversation(dana, hint);
  const tools = programmaticExtra([await echoTool()]);
  const first = await invoke(
    conv.programmatic,
    { code: 'open("ptc.txt", "w").write("before the call\\n")\nv = await echo_value(value="from the tool")\nopen("ptc.txt", "a").write(v["value"] + "\\n")\nprint("written")' },
    tools,
  );
  assert.match(first.content, /stdout:\nwritten/);
  assert.equal(first.artifact.runtime_status, 'new', JSON.stringify(first.artifact));
  assert.match(first.artifact.runtime_session_id ?? '', /^[0-9a-f]{32}$/, JSON.stringify(first.artifact));

  const second = await invoke(conv.bash, { command: 'cat ptc.txt' });
  assert.match(second.content, /stdout:\nbefore the call\nfrom the tool/);
  assert.equal(second.artifact.runtime_status, 'reused');
  assert.equal(second.artifact.runtime_session_id, first.artifact.runtime_session_id);

  // The Bash programmatic tool of the conversation reads it, and deletes it.
  const third = await invoke(
    conv.bashProgrammatic,
    { code: 'v=$(echo_value \'{"value": "again"}\')\ncat ptc.txt\nrm ptc.txt\necho "$v"' },
    tools,
  );
  assert.match(third.content, /before the call\nfrom the tool\n/);
  assert.equal(third.artifact.runtime_session_id, first.artifact.runtime_session_id, JSON.stringify(third.artifact));
  assert.deepEqual(third.artifact.deleted_files, ['ptc.txt'], JSON.stringify(third.artifact));
  const after = await invoke(conv.bash, { command: 'ls ptc.txt 2>&1 || echo absent' });
  assert.match(after.content, /absent/);

  // Another conversation of the same user does not see the first call's file.
  const other = conversation(dana, 'v2:conversation:9e9e9f');
  const elsewhere = await invoke(
    other.programmatic,
    { code: 'import os\nawait echo_value(value="x")\nprint(os.path.exists("ptc.txt"))' },
    tools,
  );
  assert.match(elsewhere.content, /stdout:\nFalse/);
  assert.notEqual(elsewhere.artifact.runtime_session_id, first.artifact.runtime_session_id);
});
