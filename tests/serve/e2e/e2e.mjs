// `gemmajit serve --cpu` on a tiny synthetic model, driven by the official openai client.
// Usage: node e2e.mjs GEMMAJIT_EXE MODEL.gguf   (run_e2e.sh installs the client and calls this)
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [exe, model] = process.argv.slice(2);
const API_KEY = 'e2e-secret';

// Starts the server on a free port and resolves with its base URL once /health is 200.
async function startServer() {
  const proc = spawn(exe, ['serve', '--model', model, '--cpu', '--port', '0', '--parallel', '4',
                           '--ctx', '256', '--api-key', API_KEY, '--temp', '0', '--threads', '2'],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`server exited ${code}: ${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (;;) {
    const r = await fetch(`${base}/health`);
    if (r.status === 200) break;
    assert.equal(r.status, 503);
    assert.equal((await r.json()).status, 'loading');
    await new Promise((res) => setTimeout(res, 50));
  }
  return { proc, base, log: () => log };
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('non-streaming chat', async ({ client }) => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 6 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  assert.ok(r.usage.prompt_tokens > 0);
});

test('streaming chat equals non-streaming (greedy), usage chunk', async ({ client }) => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Count to ten' }];
  const whole = await client.chat.completions.create({ messages, model: 'tiny', max_tokens: 8 });
  const stream = await client.chat.completions.create({
    messages, model: 'tiny', max_tokens: 8, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 8);
});

test('completions, stop sequences and max_tokens', async ({ client }) => {
  const full = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 12 });
  assert.equal(full.object, 'text_completion');
  assert.equal(full.choices[0].finish_reason, 'length');
  const text = full.choices[0].text;
  assert.ok(text.length >= 4, `short text ${JSON.stringify(text)}`);
  const stop = text.slice(2, 4);
  const cut = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 12, stop: [stop] });
  assert.equal(cut.choices[0].finish_reason, 'stop');
  assert.equal(cut.choices[0].text, text.slice(0, text.indexOf(stop)));
});

test('seeded sampling is reproducible', async ({ client }) => {
  const ask = (seed) => client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Tell a story' }], max_tokens: 10,
    temperature: 1.0, top_k: 40, seed });
  const [a, b] = [await ask(1234), await ask(1234)];
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('thinking: prompt carries <|think|>, reply fields stay apart', async ({ client, base }) => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Why?' }], max_tokens: 5, reasoning_effort: 'high' });
  assert.equal(r.choices[0].finish_reason, 'length');
  const off = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Why?' }], max_tokens: 5 });
  // <|think|> adds a system turn: the thinking prompt is longer.
  assert.ok(r.usage.prompt_tokens !== off.usage.prompt_tokens);
  const tok = await (await fetch(`${base}/tokenize`, { method: 'POST', headers: { Authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ content: '<|channel>thought\nhmm<channel|>ok' }) })).json();
  assert.ok(tok.tokens.length > 0);
});

test('tool call round trip through the API', async ({ client }) => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({
    model: 'tiny', tools, max_tokens: 4,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c":21}' }] });
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 20);
});

test('8 concurrent greedy streams each equal the prompt run alone (server and gemmajit run)', async ({ client }) => {
  const prompts = Array.from({ length: 8 }, (_, i) => `Prompt number ${i} says hi`);
  const ask = async (p, stream) => {
    const req = { model: 'tiny', messages: [{ role: 'user', content: p }], max_tokens: 8 };
    if (!stream) return (await client.chat.completions.create(req)).choices[0].message.content;
    let t = '';
    for await (const c of await client.chat.completions.create({ ...req, stream: true })) t += c.choices[0]?.delta?.content ?? '';
    return t;
  };
  const alone = [];
  for (const p of prompts) alone.push(await ask(p, false));
  const together = await Promise.all(prompts.map((p) => ask(p, true)));
  assert.deepEqual(together, alone);
  assert.ok(new Set(alone).size > 1, 'different prompts should give different replies');
  // The same prompts through `gemmajit run` (one process each, no server): the same text.
  for (const i of [0, 5]) {
    const r = spawnSync(exe, ['run', '--model', model, '--cpu', '--threads', '2', '-p', prompts[i],
                              '-n', '8', '--temp', '0'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.replace(/\n$/, ''), together[i], `prompt ${i} through gemmajit run`);
  }
});

test('a client that aborts mid-stream frees its slot', async ({ client, base }) => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Go on forever' }], stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const _ of stream) { if (++n === 3) ac.abort(); }
  } catch (e) { assert.ok(/abort/i.test(String(e.name) + String(e.message))); }
  for (let i = 0; i < 50; ++i) {
    const m = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } })).text();
    if (/gemmajit_slots_busy 0(\.0+)?\n/.test(m)) return;
    await new Promise((res) => setTimeout(res, 100));
  }
  assert.fail('the aborted stream still holds its slot');
});

test('bad requests get their 4xx and the server keeps answering', async ({ base }) => {
  const auth = { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' };
  const user = [{ role: 'user', content: 'x' }];
  const cases = [
    ['POST', '/v1/chat/completions', '{not json', 400],
    ['POST', '/v1/chat/completions', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'alien', content: 'x' }] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: '' }] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, temperature: 'hot' }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, n: 2 }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, frequency_penalty: 1 }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, response_format: { type: 'json_object' } }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'word '.repeat(400) }] }), 400],
    ['POST', '/v1/completions', JSON.stringify({ prompt: 12 }), 400],
    ['POST', '/detokenize', JSON.stringify({ tokens: [-1] }), 400],
    ['POST', '/detokenize', '{"tokens":[1e400]}', 400],
    ['POST', '/tokenize', JSON.stringify({ content: 'hi', add_special: 1 }), 400],
    ['POST', '/v1/chat/completions', `{"messages":[{"role":"user","content":"x"}],"temperature":1e400}`, 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 5, text: 'x' }] }] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, response_format: { type: 1 } }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: user, tools: [{ type: 'function',
      function: { name: 'f', parameters: { type: 'object', properties: [1, 2] } } }] }), 400],
    // Nested 100000 deep: once a stack overflow that took the whole server down.
    ['POST', '/v1/chat/completions', `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
      "function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","x":${
      '['.repeat(100000)}${']'.repeat(100000)}}}}}}]}`, 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [...user, { role: 'assistant', tool_calls: [{ id: 'c',
      function: { name: 'f', arguments: '{"a":'.repeat(100000) + '1' + '}'.repeat(100000) } }] }] }), 400],
    ['GET', '/v1/nope', undefined, 404],
  ];
  for (const [method, path, body, status] of cases) {
    const r = await fetch(base + path, { method, headers: auth, body });
    assert.equal(r.status, status, `${path} ${String(body).slice(0, 60)}`);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
    assert.ok('type' in j.error && 'param' in j.error && 'code' in j.error);
  }
  const ctx = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: auth,
    body: JSON.stringify({ messages: [{ role: 'user', content: 'word '.repeat(400) }] }) });
  assert.match((await ctx.json()).error.message, /tokens but the context holds 256/);
  const noKey = await fetch(base + '/v1/models');
  assert.equal(noKey.status, 401);
  assert.equal((await fetch(base + '/health')).status, 200);
  const models = await (await fetch(base + '/v1/models', { headers: auth })).json();
  assert.equal(models.data[0].id, 'tiny');
});

test('a body over 8 KB sent as a form (curl -d without -H) is read as JSON', async ({ base }) => {
  // httplib caps form-urlencoded bodies at 8 KB in plain handlers; the routes read bodies raw.
  const body = `{"prompt":"Once upon a time","max_tokens":2${' '.repeat(20000)}}`;
  for (const type of ['application/x-www-form-urlencoded', 'text/plain']) {
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', body,
      headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': type } });
    assert.equal(r.status, 200, `${type}: ${await r.clone().text()}`);
    assert.equal((await r.json()).usage.completion_tokens, 2);
  }
});

const { proc, base, log } = await startServer();
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
let failed = 0;
for (const t of tests) {
  const t0 = Date.now();
  try {
    await t.fn({ client, base });
    console.log(`ok   ${t.name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${t.name}: ${e.stack ?? e}`);
  }
}
// SIGTERM ends the server cleanly with status 0.
const code = await new Promise((res) => { proc.on('exit', (c) => res(c)); proc.kill('SIGTERM'); });
if (code !== 0) { failed++; console.log(`FAIL server exit status ${code}\n${log()}`); }
console.log(failed ? `${failed} failed` : 'all passed');
process.exit(failed ? 1 : 0);
