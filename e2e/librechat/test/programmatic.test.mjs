// Programmatic tool calling through the client's run_tools_with_code and
// run_tools_with_bash: the program calls tools that the client runs.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createBashProgrammaticToolCallingTool, createProgrammaticToolCallingTool } from '@librechat/agents';
import { baseUrl, authHeadersFor, invoke, langchainTool, programmaticExtra, sleep, user } from '../lib/librechat.mjs';

const carol = user('e2e-ptc-carol');
const pyTool = () => createProgrammaticToolCallingTool({ authHeaders: carol.authHeaders });
const bashTool = () => createBashProgrammaticToolCallingTool({ authHeaders: carol.authHeaders });

/** A tool that takes 2 s, and a log of when each call started and ended. */
async function slowLookup() {
  const log = [];
  const tool = await langchainTool(
    'slow_lookup',
    'Looks a key up; takes two seconds',
    { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] },
    async ({ key }) => {
      const started = Date.now();
      await sleep(2000);
      log.push({ key, started, ended: Date.now() });
      return { key, value: key.toUpperCase() };
    },
  );
  return { tool, log };
}

test('gathered calls: await asyncio.gather(...) with no import, as the tool description teaches', { timeout: 90_000 }, async () => {
  const { tool, log } = await slowLookup();
  const started = Date.now();
  const { content } = await invoke(
    pyTool(),
    {
      code: [
        'a, b, c = await asyncio.gather(slow_lookup(key="a"), slow_lookup(key="b"), slow_lookup(key="c"))',
        'print(a["value"], b["value"], c["value"])',
      ].join('\n'),
    },
    programmaticExtra([tool]),
  );
  assert.match(content, /stdout:\nA B C(?:\n|$)/);
  assert.equal(log.length, 3);
  // All three reached the client in one response: each started before any ended.
  const firstEnd = Math.min(...log.map((l) => l.ended));
  assert.ok(log.every((l) => l.started < firstEnd), `the calls ran together: ${JSON.stringify(log)}`);
  assert.ok(Date.now() - started < 10_000, 'three 2 s calls made together take about 2 s');
});

const sequential = [
  'for key in ["a", "b", "c"]:',
  '    result = await slow_lookup(key=key)',
  '    print(result["value"])',
].join('\n');

test('sequential slow tools (3 x 2 s) with the client\'s default timeout', { timeout: 90_000 }, async () => {
  const { tool, log } = await slowLookup();
  const { content } = await invoke(pyTool(), { code: sequential }, programmaticExtra([tool]));
  assert.match(content, /stdout:\nA\nB\nC(?:\n|$)/);
  assert.equal(log.length, 3);
});

test('sequential slow tools (3 x 2 s) with timeout: 5000, which bounds the program\'s own running time', { timeout: 90_000 }, async () => {
  const { tool, log } = await slowLookup();
  const { content } = await invoke(pyTool(), { code: sequential, timeout: 5000 }, programmaticExtra([tool]));
  assert.match(content, /stdout:\nA\nB\nC(?:\n|$)/);
  assert.equal(log.length, 3);
});

async function dottedTools() {
  const calls = [];
  const weather = await langchainTool(
    'get-weather',
    'Weather in a city',
    { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    async ({ city }) => {
      calls.push(`get-weather ${city}`);
      return { city, celsius: 21 };
    },
  );
  const stats = await langchainTool(
    'stats.summary',
    'Sum of a list of numbers',
    { type: 'object', properties: { values: { type: 'array', items: { type: 'number' } } }, required: ['values'] },
    async ({ values }) => {
      calls.push(`stats.summary ${values.join(',')}`);
      return { sum: values.reduce((a, b) => a + b, 0) };
    },
  );
  return { tools: [weather, stats], calls };
}

test('Bash tools named with "-" and ".": called by the names the client tells the model', { timeout: 60_000 }, async () => {
  const { tools, calls } = await dottedTools();
  // The client's rule: "-", "." and whitespace become "_".
  const { content } = await invoke(
    bashTool(),
    {
      code: [
        'w=$(get_weather \'{"city": "Paris"}\')',
        's=$(stats_summary \'{"values": [1, 2, 3]}\')',
        'echo "weather=$w"',
        'echo "stats=$s"',
      ].join('\n'),
    },
    programmaticExtra(tools),
  );
  assert.deepEqual(calls, ['get-weather Paris', 'stats.summary 1,2,3'], `the tools the program called; it said: ${content}`);
  // Each result is printed as compact JSON (in whatever key order).
  const printed = (name) => {
    const line = content.match(new RegExp(`^${name}=(.*)$`, 'm'))?.[1];
    try {
      return JSON.parse(line);
    } catch {
      return line;
    }
  };
  assert.deepEqual(printed('weather'), { city: 'Paris', celsius: 21 }, `the run said: ${content}`);
  assert.deepEqual(printed('stats'), { sum: 6 }, `the run said: ${content}`);
});

test('Python tools named with "-" and ".": called by the names the client tells the model', { timeout: 60_000 }, async () => {
  const { tools, calls } = await dottedTools();
  // The client's rule: "-" and whitespace become "_", other characters are dropped.
  const { content } = await invoke(
    pyTool(),
    {
      code: [
        'w = await get_weather(city="Oslo")',
        's = await statssummary(values=[4, 5])',
        'print(w["city"], w["celsius"], s["sum"])',
      ].join('\n'),
    },
    programmaticExtra(tools),
  );
  assert.deepEqual(calls, ['get-weather Oslo', 'stats.summary 4,5'], `the tools the program called; it said: ${content}`);
  assert.match(content, /stdout:\nOslo 21 9(?:\n|$)/);
});

test('a tool definition as LibreChat writes some, with "type": "float", is accepted and read as a number', { timeout: 60_000 }, async () => {
  const seen = [];
  const schema = (valueType) => ({
    type: 'object',
    properties: { value: { type: valueType }, factor: { type: 'integer' } },
    required: ['value', 'factor'],
  });
  const scale = await langchainTool(
    'scale',
    'Multiplies a value by a factor',
    schema('number'),
    async ({ value, factor }) => {
      seen.push([value, factor]);
      return { result: value * factor };
    },
  );
  const { content } = await invoke(
    pyTool(),
    { code: 'r = await scale(value=1.5, factor=4)\nprint(r["result"])' },
    // The definition the client sends says "float"; the tool itself validates a number.
    programmaticExtra([scale], { scale: schema('float') }),
  );
  assert.deepEqual(seen, [[1.5, 4]], `the call reached the tool; the run said: ${content}`);
  assert.match(content, /stdout:\n6(\.0)?(?:\n|$)/);
});

async function health() {
  const response = await fetch(`${baseUrl}/health`, { headers: authHeadersFor(carol.sub) });
  return response.json();
}

test('abort: the client\'s abort path cancels the run by its request id', { timeout: 90_000 }, async () => {
  const { tool } = await slowLookup();
  const before = await health();
  assert.equal(typeof before.active_runs, 'number', `health with credentials reports active_runs: ${JSON.stringify(before)}`);
  assert.equal(before.active_runs, 0, `nothing runs before the test: ${JSON.stringify(before)}`);

  const controller = new AbortController();
  // A program that would sleep 60 s, until the client's default timeout (15 s) ends it.
  const running = invoke(
    pyTool(),
    { code: 'import time\ntime.sleep(60)\nprint(await slow_lookup(key="never"))' },
    programmaticExtra([tool]),
    { signal: controller.signal },
  );
  let seen = false;
  for (let i = 0; i < 50 && !seen; i++) {
    await sleep(100);
    seen = (await health()).active_runs > 0;
  }
  assert.ok(seen, 'the program started running');
  controller.abort();
  await assert.rejects(running, 'the aborted tool call fails');

  // The client sent POST /v1/exec/programmatic/cancel {request_id}: the run ends at once.
  let after;
  for (let i = 0; i < 50; i++) {
    after = await health();
    if (after.active_runs === 0) break;
    await sleep(100);
  }
  assert.equal(after.active_runs, 0, `the cancelled run is gone within 5 s: ${JSON.stringify(after)}`);
});
