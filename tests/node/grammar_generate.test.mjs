// Acceptance test of grammar-constrained generation (issue #4): with stories260K and the
// llama-gqa EXL2 reference model, 20 diverse JSON Schemas x 20 seeds at temperature 1, every
// output of `exlagent generate --json-schema` ends because the grammar completed (EOS) and
// validates against its schema by ajv, a validator independent of the grammar engine.
// Every schema's language is finite (strings have maxLength or a bounded pattern/format, arrays
// maxItems, integers bounds, no free numbers or unbounded recursion), so the forced bytes and EOS
// finish each output within the token cap; hitting the cap counts as a failure.
// Needs EXLAGENT_BIN (default ../../build/exlagent) and the shared models (EXL_SHARED_DIR).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { bin, missing, shared } from './test_paths.mjs';

const run = promisify(execFile);
const models = {
  stories260K: path.join(shared, 'models/stories260K-hf'),
  'llama-gqa-exl2': path.join(shared, 'data/exl2-ref/llama-gqa/exl2-4.0bpw'),
};
const SEEDS = Array.from({ length: 20 }, (_, i) => 1000 + 37 * i);
const MAX_TOKENS = 160;

const str = (maxLength, extra = {}) => ({ type: 'string', maxLength, ...extra });
const int = (minimum, maximum) => ({ type: 'integer', minimum, maximum });
const obj = (properties, required = Object.keys(properties), extra = {}) =>
  ({ type: 'object', properties, required, additionalProperties: false, ...extra });

export const SCHEMAS = {
  person: obj({ name: str(12), age: int(0, 120) }),
  enum_only: { enum: ['red', 'green', 'blue', 42, null, true] },
  const_object: { const: { kind: 'fixed', n: [1, 2, 3] } },
  boolean_flags: obj({ a: { type: 'boolean' }, b: { type: 'boolean' }, c: { type: 'null' } }),
  string_array: { type: 'array', items: str(6), minItems: 1, maxItems: 4 },
  int_matrix: { type: 'array', items: { type: 'array', items: int(-9, 9), maxItems: 3 }, maxItems: 3 },
  nested: obj({ user: obj({ id: int(1, 9999), tags: { type: 'array', items: { enum: ['x', 'y', 'z'] }, maxItems: 3 } }),
    active: { type: 'boolean' } }),
  optional_props: obj({ a: int(0, 5), b: str(4), c: { type: 'boolean' } }, ['a']),
  pattern: obj({ code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2}$' }, id: { type: 'string', pattern: '^[a-f0-9]{8}$' } }),
  // format 'time' is left out: the grammar accepts a leap second (:60) at any minute, which RFC 3339
  // (and ajv) allow only at 23:59:60 UTC.
  formats: obj({ day: { type: 'string', format: 'date' }, ip: { type: 'string', format: 'ipv4' },
    uid: { type: 'string', format: 'uuid' } }),
  nullable_union: obj({ v: { type: ['string', 'null'], maxLength: 5 }, w: { type: ['integer', 'boolean'], minimum: 0, maximum: 50 } }),
  any_of: { anyOf: [obj({ cat: str(5) }), obj({ dog: int(0, 3) }), { type: 'boolean' }] },
  one_of_tagged: { oneOf: [obj({ t: { const: 'circle' }, r: int(1, 10) }), obj({ t: { const: 'rect' }, w: int(1, 10), h: int(1, 10) })] },
  refs: { $defs: { point: obj({ x: int(-5, 5), y: int(-5, 5) }) },
    ...obj({ from: { $ref: '#/$defs/point' }, to: { $ref: '#/$defs/point' } }) },
  prefix_items: { type: 'array', prefixItems: [str(5), int(0, 9), { type: 'boolean' }], items: false, minItems: 3 },
  length_bounds: obj({ s: { type: 'string', minLength: 2, maxLength: 4 }, l: { type: 'array', items: int(0, 1), minItems: 2, maxItems: 2 } }),
  int_ranges: obj({ neg: int(-1000, -10), big: int(100000, 100100), zero: int(0, 0) }),
  all_of: { allOf: [obj({ a: int(0, 9), b: str(3) }, ['a', 'b'], { additionalProperties: true }), { required: ['a', 'b'] }],
    properties: { a: true, b: true }, additionalProperties: false },
  ipv6_list: { type: 'array', items: { type: 'string', format: 'ipv6' }, minItems: 1, maxItems: 2 },
  unicode_enum: obj({ word: { enum: ['héllo', 'naïve', '日本', 'ok'] }, note: str(3) }),
};

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

async function generate(modelDir, schemaFile) {
  const { stdout } = await run(bin, ['generate', '--model', modelDir, '--json-schema', schemaFile,
    '--seeds', SEEDS.join(','), '--temperature', '1', '--max-tokens', String(MAX_TOKENS), '--threads', '1'],
  { maxBuffer: 1 << 24 });
  return stdout.trim().split('\n').map((l) => JSON.parse(l));
}

for (const [modelName, modelDir] of Object.entries(models)) {
  const skip = missing(path.join(modelDir, 'config.json'));
  test(`${modelName}: 20 schemas x 20 seeds validate with ajv`, { skip }, async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'exl-grammar-'));
    const failures = [];
    let checked = 0;
    try {
      const entries = Object.entries(SCHEMAS);
      assert.equal(entries.length, 20);
      // Two processes at a time: CI has two cores.
      for (let i = 0; i < entries.length; i += 2) {
        await Promise.all(entries.slice(i, i + 2).map(async ([name, schema]) => {
          const validate = ajv.compile(schema);
          const file = path.join(dir, `${name}.json`);
          writeFileSync(file, JSON.stringify(schema));
          const lines = await generate(modelDir, file);
          assert.equal(lines.length, SEEDS.length, name);
          for (const l of lines) {
            checked++;
            let value;
            let ok = l.finish_reason === 'stop_token';
            try { value = JSON.parse(l.text); } catch { ok = false; }
            if (ok && !validate(value)) ok = false;
            if (!ok) failures.push(`${name} seed ${l.seed}: ${l.finish_reason} ${JSON.stringify(l.text)} ${l.error ?? ''} ${JSON.stringify(validate.errors ?? [])}`);
          }
        }));
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(checked, 400);
    assert.deepEqual(failures, []);
  });
}
