// docs/workflow.schema.json checked by an independent validator (ajv, JSON Schema 2020-12): the
// example workflow is valid, and the malformed files exlagent refuses are refused by ajv too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import { sourceDir as root } from './test_paths.mjs';

const schema = JSON.parse(readFileSync(path.join(root, 'docs', 'workflow.schema.json'), 'utf8'));
const validate = new Ajv2020({ allErrors: true, strict: true, allowUnionTypes: true }).compile(schema);

test('the example workflow is valid', () => {
  const wf = JSON.parse(readFileSync(path.join(root, 'examples', 'workflow', 'workflow.json'), 'utf8'));
  assert.ok(validate(wf), JSON.stringify(validate.errors));
});

test('the documented example is valid', () => {
  const md = readFileSync(path.join(root, 'docs', 'workflow-format.md'), 'utf8');
  const block = md.slice(md.lastIndexOf('```json') + 7, md.lastIndexOf('```'));
  assert.ok(validate(JSON.parse(block)), JSON.stringify(validate.errors));
});

test('malformed workflows are refused', () => {
  const bad = [
    {},
    { steps: [] },
    { steps: [{ name: 'a' }] },
    { steps: [{ name: '1x', prompt: 'p' }] },
    { steps: [{ name: 'a', prompt: 'p', bogus: 1 }] },
    { steps: [{ name: 'a', prompt: 'p' }], extra: 0 },
    { steps: [{ name: 'a', prompt: 'p', for_each: 'outputs.x' }] },
    { steps: [{ name: 'a', prompt: 'p', if: { equals: 1 } }] },
    { steps: [{ name: 'a', prompt: 'p', max_tokens: 0 }] },
    { steps: [{ name: 'a', prompt: 'p', schema: 3 }] },
    { defaults: { top_k: 3 }, steps: [{ name: 'a', prompt: 'p' }] },
  ];
  for (const wf of bad) assert.equal(validate(wf), false, JSON.stringify(wf));
  assert.ok(validate({ steps: [{ name: 'a', prompt: 'p', if: { path: 'steps.x.y', not_equals: null } }] }));
});
