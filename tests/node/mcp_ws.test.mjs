// The official MCP TypeScript SDK client on /v1/ws (WebSocketClientTransport, subprotocol "mcp")
// against a real `exlagent serve` on stories260K with a --read-root: the client initializes,
// lists the server's tools (the built-ins) and calls calculator and read_file; an unknown tool is a
// JSON-RPC error. The server runs without an API key (loopback), as the transport sends no headers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { WebSocketClientTransport } from '@modelcontextprotocol/sdk/client/websocket.js';
import { startServe } from './serve.mjs';
import { bin, missing, storiesModel } from './test_paths.mjs';

globalThis.WebSocket ??= WebSocket;  // Node 20 has no global WebSocket; the transport uses it

const modelDir = storiesModel;
const skip = missing(path.join(modelDir, 'model.safetensors'));

let server;
let client;
let tmp;

before(async () => {
  if (skip) return;
  tmp = mkdtempSync(path.join(os.tmpdir(), 'exl-mcp-ws-'));
  mkdirSync(path.join(tmp, 'root'));
  writeFileSync(path.join(tmp, 'root', 'note.txt'), 'buy 3 lemons\n');
  let port;
  ({ server, port } = await startServe(bin, ['--model', modelDir, '--port', '0', '--threads', '1',
                       '--session-dir', path.join(tmp, 'sessions'), '--read-root', path.join(tmp, 'root')]));
  client = new Client({ name: 'exlagent-node-test', version: '1.0.0' });
  await client.connect(new WebSocketClientTransport(new URL(`ws://127.0.0.1:${port}/v1/ws`)));
});

after(async () => {
  if (client) await client.close();
  if (server) {
    const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
    server.kill('SIGTERM');
    assert.equal(await exited, 0, 'graceful exit on SIGTERM');
  }
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

test('initialize names the server and its tools capability', { skip }, () => {
  assert.equal(client.getServerVersion().name, 'exlagent');
  assert.ok(client.getServerCapabilities().tools);
});

test('tools/list offers the built-in tools', { skip }, async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, ['calculator', 'current_time', 'json_query', 'read_file', 'regex_extract']);
  for (const t of tools) assert.equal(t.inputSchema.type, 'object', t.name);
});

test('tools/call runs a tool and reports its errors as isError', { skip }, async () => {
  const sum = await client.callTool({ name: 'calculator', arguments: { expression: '0.1 + 0.2 * 3' } });
  assert.equal(sum.isError, false);
  assert.deepEqual(sum.content, [{ type: 'text', text: '0.7' }]);
  const note = await client.callTool({ name: 'read_file', arguments: { path: 'note.txt' } });
  assert.equal(note.isError, false);
  assert.match(note.content[0].text, /buy 3 lemons/);
  const outside = await client.callTool({ name: 'read_file', arguments: { path: '../x' } });
  assert.equal(outside.isError, true);
  await assert.rejects(client.callTool({ name: 'nope', arguments: {} }), /Unknown tool: nope/);
});
