// `gemmajit serve --cpu` on a tiny synthetic model, driven by the official openai client.
// Usage: node e2e.mjs GEMMAJIT_EXE MODEL.gguf   (run_e2e.sh installs the client and calls this)
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [exe, model] = process.argv.slice(2);
const API_KEY = 'e2e-secret';

// Starts the server on a free port and resolves with its base URL once /health is 200.
async function startServer(args) {
  const proc = spawn(exe, ['serve', '--model', model, '--cpu', '--port', '0', '--api-key', API_KEY,
                           '--temp', '0', '--threads', '2', ...args],
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

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

// The server's /metrics as { name: value } (the gemmajit_ prefix dropped).
async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } })).text();
  const m = {};
  for (const line of text.split('\n')) {
    const r = line.match(/^gemmajit_(\w+) (\S+)$/);
    if (r) m[r[1]] = Number(r[2]);
  }
  return m;
}

// Polls /metrics until `pred` holds; fails naming `what` after a deadline generous enough for a
// loaded machine (each step it waits for takes milliseconds on an idle one).
async function until(base, what, pred, ms = 30000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const m = await metrics(base);
    if (pred(m)) return m;
    if (Date.now() > deadline) assert.fail(`timed out waiting until ${what}; metrics: ${JSON.stringify(m)}`);
    await sleep(20);
  }
}

// The main server: 4 slots of 256 tokens.
const tests = [];
const test = (name, fn) => tests.push({ name, fn });
// A second server, one slot of the model's 4096 tokens (a request without max_tokens runs for
// seconds) and 8 HTTP threads, so at most 8 - 4 = 4 generation requests in flight.
const oneSlotTests = [];
const oneSlotTest = (name, fn) => oneSlotTests.push({ name, fn });
const BOUND = 4;

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

test('tool_choice naming a function makes the reply a call of it', async ({ client }) => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const auto = await client.chat.completions.create({ model: 'tiny', tools, messages, max_tokens: 4 });
  const named = await client.chat.completions.create({ model: 'tiny', tools, messages, max_tokens: 4,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  // The prompt ends with the call's opening: <|tool_call> (one token), then call:get_weather{.
  assert.ok(named.usage.prompt_tokens > auto.usage.prompt_tokens + 1);
  // The tiny random model rarely closes the call it was made to open: then the call comes back
  // as content, as written; a closed one comes back as a tool call of that function.
  const m = named.choices[0].message;
  assert.ok(m.tool_calls?.[0]?.function?.name === 'get_weather' ||
            (m.content ?? '').startsWith('<|tool_call>call:get_weather{'), JSON.stringify(m));
  await assert.rejects(client.chat.completions.create({ model: 'tiny', tools, messages,
    tool_choice: { type: 'function', function: { name: 'not_a_tool' } } }), (e) => e.status === 400);
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, tool_choice: 'required' }),
    (e) => e.status === 400);
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
  // Its place among the requests in flight comes back too.
  await until(base, 'the aborted stream frees its slot', (m) => m.slots_busy === 0 && m.requests_in_flight === 0);
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

test('--http-threads that leaves no thread per slot is refused, naming the bound', async () => {
  const r = spawnSync(exe, ['serve', '--model', model, '--cpu', '--parallel', '2', '--http-threads', '5'],
                      { encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--http-threads must be 0 \(automatic\) or in \[6, 4096\].*got 5/);
});

test('a --port past 65535 is refused (the socket would listen on it modulo 65536)', async () => {
  const r = spawnSync(exe, ['serve', '--model', model, '--cpu', '--port', '70000'], { encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--port/);
  assert.match(r.stderr, /65535/);
});

oneSlotTest('a non-streamed reply that takes seconds starts with spaces and still parses', async ({ client, base }) => {
  // No max_tokens: it runs to the end of the context, seconds, so the wait shows as leading spaces.
  const r = await fetch(`${base}/v1/completions`, { method: 'POST',
    headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time' }) });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^application\/json/);
  const text = await r.text();
  assert.match(text, /^ +\{/, 'a reply that took over a second should start with spaces');
  const raw = JSON.parse(text);
  assert.equal(raw.choices[0].finish_reason, 'length');
  // The same request through the openai client: the spaces are invisible to it.
  const viaClient = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time' });
  assert.equal(viaClient.choices[0].text, raw.choices[0].text);
  assert.equal(viaClient.usage.completion_tokens, raw.usage.completion_tokens);
});

oneSlotTest('a non-streamed request whose client aborts stops generating, running or queued', async ({ client, base }) => {
  const before = await metrics(base);
  const ask = (content, signal) => client.chat.completions.create(
    { model: 'tiny', messages: [{ role: 'user', content }] }, { signal }).then(() => 'finished', (e) => e);
  const [acA, acB] = [new AbortController(), new AbortController()];
  const a = ask('Go on forever', acA.signal);
  const running = await until(base, 'A generates', (m) => m.generated_tokens_total > before.generated_tokens_total);
  const b = ask('And ever and ever', acB.signal);
  await until(base, 'B waits in the queue', (m) => m.queue_length === 1);
  acB.abort();
  await until(base, 'the aborted B leaves the queue', (m) => m.queue_length === 0 && m.requests_in_flight === 1);
  acA.abort();
  const stopped = await until(base, 'the aborted A frees its slot', (m) => m.slots_busy === 0 && m.requests_in_flight === 0);
  // A stopped long before the end of its 4096-token context, and B never ran (no prompt of its
  // prefilled; A's was all in before A's first token).
  const generated = stopped.generated_tokens_total - before.generated_tokens_total;
  assert.ok(generated < 3500, `A ran on to ${generated} tokens after its client left`);
  assert.equal(stopped.prompt_tokens_total, running.prompt_tokens_total, 'the aborted queued request ran');
  await sleep(500);
  assert.equal((await metrics(base)).generated_tokens_total, stopped.generated_tokens_total, 'generation goes on');
  for (const r of [await a, await b]) assert.ok(/abort/i.test(String(r?.name) + String(r?.message)), String(r));
});

oneSlotTest(`past ${BOUND} generation requests in flight: 503 with Retry-After at once, /health stays quick`, async ({ client, base }) => {
  const headers = { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' };
  const extra = 3;
  const acs = Array.from({ length: BOUND + extra }, () => new AbortController());
  // fetch resolves with the headers: a 200 goes out once the job is queued, a 503 at once.
  const t0 = performance.now();
  const rs = await Promise.all(acs.map((ac, i) => fetch(`${base}/v1/completions`, { method: 'POST', headers,
    signal: ac.signal, body: JSON.stringify({ prompt: `Request ${i} goes on and on` }) })));
  const answered = performance.now() - t0;
  const busy = rs.filter((r) => r.status === 503);
  assert.equal(rs.filter((r) => r.status === 200).length, BOUND, rs.map((r) => r.status).join(' '));
  assert.equal(busy.length, extra);
  for (const r of busy) {
    assert.equal(r.headers.get('retry-after'), '1');
    const e = (await r.json()).error;
    assert.equal(e.message, `server busy: ${BOUND} requests in flight; retry later`);
    assert.equal(e.type, 'server_error');
    assert.equal(e.code, 'server_busy');
  }
  assert.ok(answered < 10000, `the 503s took ${answered} ms`);
  // The cheap endpoints answer while the one slot works through the queue (each request runs for
  // seconds): before the bound, /health waited for a request to end.
  for (let i = 0; i < 3; ++i) {
    const h0 = performance.now();
    assert.equal((await fetch(`${base}/health`)).status, 200);
    const took = performance.now() - h0;
    assert.ok(took < 1000, `/health took ${took} ms`);
  }
  assert.equal((await metrics(base)).requests_in_flight, BOUND);
  // The scheduler takes the first request into the slot on its own thread (seconds later in a
  // sanitizer build): waited for, not sampled.
  await until(base, 'the slot runs one of them', (m) => m.slots_busy === 1 && m.requests_in_flight === BOUND);
  // Every admitted client leaves; the running request and the queued ones all go, and their
  // places come back: as many requests as the bound then succeed at once.
  for (const ac of acs) ac.abort();
  await until(base, 'every aborted request is gone', (m) => m.requests_in_flight === 0 && m.slots_busy === 0 && m.queue_length === 0);
  const again = await Promise.all(Array.from({ length: BOUND }, (_, i) =>
    client.completions.create({ model: 'tiny', prompt: `Short ${i}`, max_tokens: 2 })));
  for (const r of again) assert.equal(r.usage.completion_tokens, 2);
});

let failed = 0;
async function runTests(args, list) {
  const { proc, base, log } = await startServer(args);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
  for (const t of list) {
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
}
await runTests(['--parallel', '4', '--ctx', '256'], tests);
await runTests(['--parallel', '1', '--http-threads', '8'], oneSlotTests);
console.log(failed ? `${failed} failed` : 'all passed');
process.exit(failed ? 1 : 0);
