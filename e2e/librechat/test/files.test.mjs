// Files as LibreChat moves them: its server's upload, batch upload, download and
// freshness-check requests, the client's fetchSessionFiles, and the files a
// conversation's runs hand on to each other.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createBashExecutionTool, createCodeExecutionTool, fetchSessionFiles } from '@librechat/agents';
import {
  CodeSession,
  batchUploadRaw,
  download,
  injected,
  invoke,
  listFull,
  objectInfo,
  upload,
  user,
} from '../lib/librechat.mjs';

const bob = user('e2e-files-bob');
const codeTool = () => createCodeExecutionTool({ user_id: bob.sub, authHeaders: bob.authHeaders });
const bashTool = () => createBashExecutionTool({ user_id: bob.sub, authHeaders: bob.authHeaders });
const outputs = (artifact) => (artifact.files ?? []).filter((f) => f.inherited !== true);

test('files in and out: upload, a run that reads it and writes a file, list, metadata and download', { timeout: 60_000 }, async () => {
  const csv = 'region,amount\nnorth,120\nsouth,80\nnorth,45\n';
  const up = await upload(bob, { name: 'data.csv', content: csv, type: 'text/csv' });
  assert.equal(up.body.files[0].filename, 'data.csv');

  // LibreChat's freshness check before it injects an uploaded file again.
  const info = await objectInfo(bob, up.storage_session_id, up.file_id);
  assert.equal(info.status, 200, `object info: ${JSON.stringify(info.body)}`);
  assert.ok(!Number.isNaN(Date.parse(info.body.lastModified)), `lastModified: ${JSON.stringify(info.body)}`);

  const { content, artifact } = await invoke(
    codeTool(),
    {
      lang: 'py',
      code: [
        'import csv',
        'totals = {}',
        "for row in csv.DictReader(open('data.csv')):",
        "    totals[row['region']] = totals.get(row['region'], 0) + int(row['amount'])",
        "with open('report.txt', 'w') as out:",
        '    for region, total in sorted(totals.items()):',
        "        print(region, total, file=out)",
        "print('wrote report.txt')",
      ].join('\n'),
    },
    { _injected_files: [injected({ id: up.file_id, name: 'data.csv', storage_session_id: up.storage_session_id })] },
  );
  assert.match(content, /wrote report\.txt/);
  const produced = outputs(artifact);
  assert.deepEqual(produced.map((f) => f.name), ['report.txt'], `outputs: ${JSON.stringify(artifact.files)}`);
  const report = produced[0];
  const reportSession = report.storage_session_id ?? artifact.session_id;

  const got = await download(bob, reportSession, report.id);
  assert.equal(got.status, 200);
  assert.equal(got.bytes.toString(), 'north 165\nsouth 80\n');

  // The list the client reads (detail=full), raw, then through fetchSessionFiles.
  const listed = await listFull(bob, reportSession);
  assert.equal(listed.status, 200, `list: ${JSON.stringify(listed.body)}`);
  const entry = listed.body.find((f) => typeof f.name === 'string' && f.name.startsWith(`${reportSession}/${report.id}`));
  assert.ok(entry, `report.txt in the full list: ${JSON.stringify(listed.body)}`);
  assert.equal(entry.metadata?.['original-filename'], 'report.txt', `metadata: ${JSON.stringify(entry)}`);
  assert.ok(entry.lastModified && entry.contentType !== undefined, `fields: ${JSON.stringify(entry)}`);

  const files = await fetchSessionFiles(bob.baseUrl, reportSession, { kind: 'user', id: bob.sub }, bob.authHeaders);
  const seen = files.find((f) => f.id === report.id);
  assert.ok(seen, `fetchSessionFiles found the output: ${JSON.stringify(files)}`);
  assert.equal(seen.name, 'report.txt');
  assert.equal(seen.storage_session_id, reportSession);
});

test('batch upload: several files in one request, then one run that reads them all', { timeout: 60_000 }, async () => {
  const files = [1, 2, 3].map((n) => ({ name: `part${n}.txt`, content: `${n * 10}\n`, type: 'text/plain' }));
  const { status, body } = await batchUploadRaw(bob, files);
  assert.equal(status, 200, `batch upload: ${JSON.stringify(body)}`);
  assert.equal(body.message, 'success');
  assert.ok(body.storage_session_id);
  assert.equal(body.succeeded, 3);
  assert.equal(body.failed, 0);
  assert.deepEqual(body.files.map((f) => [f.status, f.filename]), files.map((f) => ['success', f.name]));
  for (const f of body.files) assert.match(f.fileId, /^[A-Za-z0-9_-]{21}$/);

  const refs = body.files.map((f) => injected({ id: f.fileId, name: f.filename, storage_session_id: body.storage_session_id }));
  const { content } = await invoke(
    codeTool(),
    { lang: 'py', code: "print(sum(int(open(f'part{n}.txt').read()) for n in (1, 2, 3)))" },
    { _injected_files: refs },
  );
  assert.match(content, /stdout:\n60(?:\n|$)/);
});

test('nested names: skill/scripts/run.py is staged at that path, by upload and by read-only batch upload', { timeout: 60_000 }, async () => {
  const script = "import pathlib\nprint('skill says', pathlib.Path('skill/SKILL.md').read_text().strip())\n";
  const single = await upload(bob, { name: 'skill/scripts/run.py', content: script, type: 'text/x-python' });
  assert.equal(single.body.files[0].filename, 'skill/scripts/run.py', `folders kept: ${JSON.stringify(single.body)}`);

  // How LibreChat uploads a skill's files: one read-only batch, kind "skill" with its version.
  const identity = { kind: 'skill', id: 'e2e-skill', version: 1 };
  const batch = await batchUploadRaw(
    bob,
    [
      { name: 'skill/SKILL.md', content: 'hello from SKILL.md\n', type: 'text/markdown' },
      { name: 'skill/scripts/run.py', content: script, type: 'text/x-python' },
    ],
    { identity, readOnly: true },
  );
  assert.equal(batch.status, 200, `batch upload: ${JSON.stringify(batch.body)}`);
  assert.deepEqual(batch.body.files.map((f) => f.filename), ['skill/SKILL.md', 'skill/scripts/run.py']);
  const refs = batch.body.files.map((f) =>
    injected({
      id: f.fileId,
      name: f.filename,
      storage_session_id: batch.body.storage_session_id,
      kind: identity.kind,
      version: identity.version,
      resource_id: identity.id,
    }),
  );

  // The program runs the script by its path, and changes a read-only input (or tries to:
  // whether the file may be written in the sandbox is not the point here).
  const { content, artifact } = await invoke(
    bashTool(),
    { command: 'python3 skill/scripts/run.py; (echo changed >> skill/SKILL.md) 2>/dev/null; echo new > made.txt' },
    { _injected_files: refs },
  );
  assert.match(content, /skill says hello from SKILL\.md/);
  // A read-only input is never an output, even when the program changed it.
  assert.deepEqual(outputs(artifact).map((f) => f.name), ['made.txt'], `outputs: ${JSON.stringify(artifact.files)}`);
  // Both come back as the inputs they were, with their own ids.
  const skillFiles = (artifact.files ?? []).filter((f) => f.name.startsWith('skill/'));
  assert.deepEqual(skillFiles.map((f) => f.name).sort(), ['skill/SKILL.md', 'skill/scripts/run.py'], `files: ${JSON.stringify(artifact.files)}`);
  for (const f of skillFiles) {
    assert.equal(f.inherited, true, `a read-only input comes back as inherited: ${JSON.stringify(f)}`);
    assert.equal(f.id, refs.find((r) => r.name === f.name).id, `with its own id: ${JSON.stringify(f)}`);
  }
});

test('chained sessions: the files one run writes are the next runs\' inputs', { timeout: 90_000 }, async () => {
  const session = new CodeSession();

  const first = await invoke(bashTool(), { command: 'mkdir -p notes && echo "first line" > notes/log.txt && echo 1 > count.txt' }, session.extra());
  assert.deepEqual(outputs(first.artifact).map((f) => f.name).sort(), ['count.txt', 'notes/log.txt']);
  session.update(first.artifact);

  // Changes one of them, leaves the other alone.
  const second = await invoke(
    codeTool(),
    {
      lang: 'py',
      code: [
        "n = int(open('count.txt').read()) + 1",
        "open('count.txt', 'w').write(f'{n}\\n')",
        "print('log:', open('notes/log.txt').read().strip(), '| count:', n)",
      ].join('\n'),
    },
    session.extra(),
  );
  assert.match(second.content, /log: first line \| count: 2/);
  const changed = outputs(second.artifact);
  assert.deepEqual(changed.map((f) => f.name), ['count.txt'], `outputs: ${JSON.stringify(second.artifact.files)}`);
  // A changed input is a new file that names the input it came from.
  const firstCount = session.files.find((f) => f.name === 'count.txt');
  assert.notEqual(changed[0].id, firstCount.id, 'the changed count.txt is a new file');
  assert.deepEqual(
    changed[0].modified_from,
    { id: firstCount.id, storage_session_id: firstCount.storage_session_id },
    `modified_from names the input: ${JSON.stringify(changed[0])}`,
  );
  const inherited = (second.artifact.files ?? []).filter((f) => f.inherited === true);
  assert.deepEqual(inherited.map((f) => f.name), ['notes/log.txt'], `the unchanged input comes back inherited: ${JSON.stringify(second.artifact.files)}`);
  session.update(second.artifact);

  const third = await invoke(bashTool(), { command: 'cat notes/log.txt count.txt' }, session.extra());
  assert.match(third.content, /stdout:\nfirst line\n2(?:\n|$)/);
});
