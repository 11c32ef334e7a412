// Runs through the client's execute_code and bash_tool tools, as a model's
// tool calls reach them in LibreChat.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createBashExecutionTool, createCodeExecutionTool } from '@librechat/agents';
import { baseUrl, invoke, openBaseUrl, postJson, upload, download, user, authHeadersFor } from '../lib/librechat.mjs';

const alice = user('e2e-exec-alice');

test('Python: execute_code runs a program and the model sees its output', { timeout: 60_000 }, async () => {
  const tool = createCodeExecutionTool({ user_id: alice.sub, authHeaders: alice.authHeaders });
  const { content, artifact } = await invoke(tool, {
    lang: 'py',
    code: 'import sys\nprint(sum(range(101)))\nprint("to stderr", file=sys.stderr)',
  });
  assert.match(content, /stdout:\n5050(?:\n|$)/);
  assert.match(content, /stderr:\nto stderr(?:\n|$)/);
  assert.match(artifact.session_id, /^[A-Za-z0-9_-]{21}$/, 'a nanoid-shaped session id');
});

test('Bash: bash_tool runs a command with arguments', { timeout: 60_000 }, async () => {
  const tool = createBashExecutionTool({ user_id: alice.sub, authHeaders: alice.authHeaders });
  const { content, artifact } = await invoke(tool, {
    command: 'echo "args: $1 $2"; echo "pwd: $PWD"',
    args: ['one', 'two'],
  });
  assert.match(content, /args: one two/);
  assert.match(content, /pwd: \/mnt\/data/);
  assert.ok(artifact.session_id);
});

test('JavaScript and TypeScript: execute_code runs lang "js" and "ts"', { timeout: 60_000 }, async () => {
  const tool = createCodeExecutionTool({ user_id: alice.sub, authHeaders: alice.authHeaders });
  const js = await invoke(tool, {
    lang: 'js',
    code: 'const n = await Promise.resolve(21);\nconsole.log(n * 2);\nconsole.error("to stderr");',
  });
  assert.match(js.content, /stdout:\n42(?:\n|$)/);
  assert.match(js.content, /stderr:\nto stderr(?:\n|$)/);
  const ts = await invoke(tool, {
    lang: 'ts',
    code: 'interface P { x: number }\nconst p: P = { x: 7 };\nconsole.log(p.x * 6);',
  });
  assert.match(ts.content, /stdout:\n42(?:\n|$)/);
});

test('Compiled languages: execute_code runs lang "rs", "c" and "java", and shows the model a compile error', { timeout: 60_000 }, async () => {
  const tool = createCodeExecutionTool({ user_id: alice.sub, authHeaders: alice.authHeaders });
  const rs = await invoke(tool, { lang: 'rs', code: 'fn main() {\n    println!("{}", 6 * 7);\n}\n' });
  assert.match(rs.content, /stdout:\n42(?:\n|$)/);
  const c = await invoke(tool, {
    lang: 'c',
    code: '#include <stdio.h>\nint main(int argc, char **argv) { printf("%s\\n", argv[1]); return 0; }\n',
    args: ['from c'],
  });
  assert.match(c.content, /stdout:\nfrom c(?:\n|$)/);
  const java = await invoke(tool, {
    lang: 'java',
    code: 'public class Main {\n    public static void main(String[] args) {\n        System.out.println(6 * 7);\n    }\n}\n',
  });
  assert.match(java.content, /stdout:\n42(?:\n|$)/);
  const broken = await invoke(tool, { lang: 'rs', code: 'fn main() {\n    let x: i32 = "s";\n}\n' });
  assert.match(broken.content, /stderr:[\s\S]*main\.rs:2:18/);
});

test('lang "rs" on a server without its toolchain is refused with unsupported_capability, which the client tells the model not to retry', { timeout: 60_000 }, async () => {
  // The "open" server's toolchain_path holds no compiler.
  const raw = await postJson(`${openBaseUrl}/exec`, { lang: 'rs', code: 'fn main() {}' }, {});
  assert.equal(raw.status, 400, `POST /exec lang rs: ${JSON.stringify(raw.body)}`);
  assert.equal(raw.body.code, 'unsupported_capability', `body: ${JSON.stringify(raw.body)}`);
  assert.equal(typeof raw.body.error, 'string');
  assert.equal(typeof raw.body.error_type, 'string');

  const tool = createCodeExecutionTool({ baseUrl: openBaseUrl, user_id: 'e2e-open-rs' });
  await assert.rejects(invoke(tool, { lang: 'rs', code: 'fn main() {}' }), (error) => {
    assert.match(error.message, /Code execution is not supported by the selected environment\./);
    assert.match(error.message, /Do not retry this tool in this environment/);
    return true;
  });
});

// LibreChat with JWT off sends no auth header at all; sandcall serves it on a
// private network with allow_unauthenticated.
const guest = user('e2e-open-guest', { url: openBaseUrl, jwt: false });

test('JWT off: execute_code and bash_tool against a server with allow_unauthenticated', { timeout: 60_000 }, async () => {
  const py = createCodeExecutionTool({ baseUrl: openBaseUrl, user_id: guest.sub });
  const ran = await invoke(py, { lang: 'py', code: 'print(6 * 7)' });
  assert.match(ran.content, /stdout:\n42(?:\n|$)/);
  const sh = createBashExecutionTool({ baseUrl: openBaseUrl, user_id: guest.sub });
  const bashed = await invoke(sh, { command: 'echo open' });
  assert.match(bashed.content, /stdout:\nopen(?:\n|$)/);
});

test('JWT off: upload, a run that reads the file, and the download of its output', { timeout: 60_000 }, async () => {
  const up = await upload(guest, { name: 'in.txt', content: 'plain\n', type: 'text/plain' });
  const tool = createCodeExecutionTool({ baseUrl: openBaseUrl, user_id: guest.sub });
  const { artifact } = await invoke(
    tool,
    { lang: 'py', code: "open('out.txt', 'w').write(open('in.txt').read().upper())" },
    {
      _injected_files: [
        { id: up.file_id, resource_id: up.file_id, name: 'in.txt', storage_session_id: up.storage_session_id, kind: 'user' },
      ],
    },
  );
  const out = (artifact.files ?? []).find((f) => f.name === 'out.txt');
  assert.ok(out, `out.txt among the outputs: ${JSON.stringify(artifact.files)}`);
  const got = await download(guest, out.storage_session_id ?? artifact.session_id, out.id);
  assert.equal(got.status, 200);
  assert.equal(got.bytes.toString(), 'PLAIN\n');
});
