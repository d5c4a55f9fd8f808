// `exlagent mcp-serve` from the official MCP TypeScript SDK client: StdioClientTransport spawns
// it on the embedded demo model (CPU), the client initializes, lists the tools and calls
// `extract` on a short invoice with a small schema; the result must be JSON valid under the
// schema (checked with ajv) and carry the invoice's values. Then the error paths a host sees: an
// unknown tool is a JSON-RPC error, a bad schema an isError result.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import Ajv from 'ajv';
import { bin, missing, sourceDir } from './test_paths.mjs';

const modelDir = path.join(sourceDir, 'examples/demo-model/model');
const skip = missing(path.join(modelDir, 'config.json'));

const SCHEMA = {
  type: 'object',
  properties: {
    invoice_number: { type: 'string' },
    customer: { type: 'string' },
    amount: { type: 'number' },
  },
  required: ['invoice_number', 'customer', 'amount'],
};
const DOCUMENT = 'Invoice INV-20417 was issued to Maria Rossi. The invoice is dated March 14, 2024. '
  + 'The total due is €1,250.40.';

let client;

before(async () => {
  if (skip) return;
  const transport = new StdioClientTransport({
    command: bin, args: ['mcp-serve', '--model', modelDir, '--threads', '1'], stderr: 'ignore',
  });
  client = new Client({ name: 'exlagent-node-test', version: '1.0.0' });
  await client.connect(transport);
});

after(async () => {
  if (client) await client.close();
});

test('initialize names the server', { skip }, () => {
  assert.equal(client.getServerVersion().name, 'exlagent');
  assert.ok(client.getServerCapabilities().tools);
});

test('tools/list offers extract and agent', { skip }, async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, ['agent', 'extract']);
  const extract = tools.find((t) => t.name === 'extract');
  assert.deepEqual(extract.inputSchema.required, ['document', 'schema']);
});

test('extract returns JSON valid under the schema', { skip }, async () => {
  const result = await client.callTool({ name: 'extract', arguments: { document: DOCUMENT, schema: SCHEMA } });
  assert.equal(result.isError, false);
  const obj = JSON.parse(result.content[0].text);
  const validate = new Ajv().compile(SCHEMA);
  assert.ok(validate(obj), JSON.stringify(validate.errors));
  assert.deepEqual(Object.keys(obj), ['invoice_number', 'customer', 'amount']);
  assert.equal(obj.invoice_number, 'INV-20417');
  assert.equal(obj.customer, 'Maria Rossi');
  assert.deepEqual(result.structuredContent, obj);
});

test('an unknown tool is a JSON-RPC error, a bad schema a tool error', { skip }, async () => {
  await assert.rejects(client.callTool({ name: 'nope', arguments: {} }), /unknown tool 'nope'/);
  const bad = await client.callTool({
    name: 'extract', arguments: { document: 'x', schema: { type: 'object', properties: { a: { type: 'string', pattern: '(' } } } },
  });
  assert.equal(bad.isError, true);
  assert.match(bad.content[0].text, /argument 'schema'/);
});
