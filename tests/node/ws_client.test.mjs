// The /v1/ws JSON-RPC API from Node with the npm `ws` package, against a real `exlagent serve`
// (stories260K, CPU): register a tool, create a session, send a message, answer the runtime's
// tools/call, and receive the events up to the final answer; the second turn is a prefix-cache
// hit. The tiny model cannot call tools itself (examples/ws-tool-client shows the demo model doing it), so
// the server runs with --agent-script (a test-only flag that forces each turn's output).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { startServe } from './serve.mjs';
import { bin, missing, storiesModel } from './test_paths.mjs';

const modelDir = storiesModel;
const skip = missing(path.join(modelDir, 'model.safetensors'));
const KEY = 'node-ws-key';
// Mistral's tool format is the most compact; stories260K's context is only 512 tokens.
const CALL = '[TOOL_CALLS] [{"name": "lookup", "arguments": {"city": "Oslo"}}]';
const ANSWER = 'Once upon a time it was 4 degrees in Oslo and the little cat went out to play.';

let server;
let port;
let tmp;

before(async () => {
  if (skip) return;
  tmp = mkdtempSync(path.join(os.tmpdir(), 'exl-ws-node-'));
  const script = path.join(tmp, 'script.json');
  writeFileSync(script, JSON.stringify([CALL, ANSWER]));
  ({ server, port } = await startServe(bin, ['--model', modelDir, '--port', '0', '--api-key', KEY, '--threads', '1',
                       '--session-dir', path.join(tmp, 'sessions'), '--agent-script', script,
                       '--chat-template', 'mistral']));
});

after(async () => {
  if (server) {
    const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
    server.kill('SIGTERM');
    assert.equal(await exited, 0, 'graceful exit on SIGTERM');
  }
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

// A JSON-RPC peer: call() awaits responses; onRequest answers the runtime's requests; events
// collects sessions/event notifications and waitFor resolves on the first matching one.
class Peer {
  constructor(ws) {
    this.ws = ws;
    this.nextId = 1;
    this.pending = new Map();
    this.events = [];
    this.waiters = [];
    this.onRequest = null;
    ws.on('message', (data, isBinary) => {
      assert.equal(isBinary, false);
      const msg = JSON.parse(data.toString());
      assert.equal(msg.jsonrpc, '2.0');
      const p = msg.method === undefined ? this.pending.get(msg.id) : undefined;
      if (p) {
        this.pending.delete(msg.id);
        p(msg);
      } else if (msg.method !== undefined && msg.id !== undefined) {
        this.onRequest?.(msg);
      } else {
        this.events.push(msg);
        this.waiters = this.waiters.filter((w) => !(w.pred(msg) && (w.resolve(msg), true)));
      }
    });
  }
  static open() {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws`, 'exlagent.v1',
                             { headers: { Authorization: `Bearer ${KEY}` } });
    return new Promise((resolve, reject) => {
      ws.on('open', () => resolve(new Peer(ws)));
      ws.on('error', reject);
    });
  }
  call(method, params = {}) {
    const id = this.nextId++;
    this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    return new Promise((resolve) => this.pending.set(id, resolve));
  }
  waitFor(pred) {
    const hit = this.events.find(pred);
    if (hit) return Promise.resolve(hit);
    return new Promise((resolve) => this.waiters.push({ pred, resolve }));
  }
  waitEvent(sessionId, type, after = 0) {
    return this.waitFor((m) => m.method === 'sessions/event' && m.params.sessionId === sessionId &&
                               m.params.type === type && this.events.indexOf(m) >= after);
  }
}

test('a session calls a tool registered over ws and finishes', { skip, timeout: 60000 }, async () => {
  const peer = await Peer.open();
  assert.equal(peer.ws.protocol, 'exlagent.v1');
  const calls = [];
  peer.onRequest = (req) => {
    assert.equal(req.method, 'tools/call');
    calls.push(req);
    peer.ws.send(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/progress',
                                  params: { progressToken: req.params._meta.progressToken, progress: 1 } }));
    peer.ws.send(JSON.stringify({ jsonrpc: '2.0', id: req.id,
                                  result: { content: [{ type: 'text', text: '4 degrees' }], isError: false } }));
  };
  const reg = await peer.call('tools/register', { tools: [{
    name: 'lookup', description: 'Current temperature of a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }] });
  assert.deepEqual(reg.result.tools, ['lookup']);
  const created = await peer.call('sessions/create', { system: 'You are helpful.', tools: ['lookup'], maxTokens: 64 });
  const sid = created.result.sessionId;
  assert.match(sid, /^s-[0-9a-f]+$/);
  assert.deepEqual((await peer.call('sessions/send', { sessionId: sid, content: 'How warm is Oslo?' })).result,
                   { accepted: true });
  const done = await peer.waitEvent(sid, 'done');
  assert.equal(done.params.reason, 'final');
  assert.ok(done.params.content.includes(ANSWER), done.params.content);
  assert.equal(done.params.turns, 2);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].params.name, 'lookup');
  assert.deepEqual(calls[0].params.arguments, { city: 'Oslo' });
  const types = peer.events.filter((m) => m.params?.sessionId === sid).map((m) => m.params.type);
  for (const t of ['token', 'tool_call', 'tool_result', 'turn_end', 'done']) assert.ok(types.includes(t), t);
  assert.ok(types.indexOf('tool_call') < types.indexOf('tool_result'));
  const result = peer.events.find((m) => m.params?.type === 'tool_result');
  assert.equal(result.params.content, '4 degrees');
  assert.equal(result.params.isError, false);

  // Turn two of the conversation reuses the cached prefix.
  const firstPrompt = peer.events.find((m) => m.params?.type === 'turn_end').params.usage.prompt_tokens;
  const mark = peer.events.length;
  await peer.call('sessions/send', { sessionId: sid, content: 'And tomorrow?' });
  const turnEnd = await peer.waitEvent(sid, 'turn_end', mark);
  assert.ok(turnEnd.params.usage.prompt_tokens_details.cached_tokens >= firstPrompt,
            JSON.stringify(turnEnd.params.usage));
  await peer.waitEvent(sid, 'done', mark);

  // Bad input gets JSON-RPC errors and the connection keeps working.
  assert.equal((await peer.call('sessions/teleport')).error.code, -32601);
  assert.equal((await peer.call('sessions/send', { sessionId: 'nope', content: 'x' })).error.code, -32011);
  peer.ws.send('{oops');
  await peer.waitFor((m) => m.error?.code === -32700);
  assert.equal((await peer.call('server/info')).result.protocol, 'exlagent.v1');
  peer.ws.close();
});
