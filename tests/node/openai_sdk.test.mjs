// The official openai npm SDK against a real `exlagent serve` on loopback (stories260K, CPU):
// every response must parse with the SDK. Needs EXLAGENT_BIN (default ../../build/exlagent) and
// the shared stories260K-hf model (EXL_SHARED_DIR, default ../../../shared).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { startServe } from './serve.mjs';
import { bin, missing, storiesModel } from './test_paths.mjs';

const modelDir = storiesModel;
const skip = missing(path.join(modelDir, 'model.safetensors'));
const KEY = 'node-test-key';

let server;
let client;

before(async () => {
  if (skip) return;
  let port;
  ({ server, port } = await startServe(bin, ['--model', modelDir, '--port', '0', '--api-key', KEY, '--threads', '1']));
  client = new OpenAI({ apiKey: KEY, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
});

after(async () => {
  if (!server) return;
  const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve({ code, signal })));
  server.kill('SIGTERM');
  const { code } = await exited;
  assert.equal(code, 0, 'graceful exit on SIGTERM');
});

const messages = [
  { role: 'system', content: 'You tell short stories for small children.' },
  { role: 'user', content: 'Tell me a story about a brave little dog.' },
];

test('chat completion parses with the SDK', { skip }, async () => {
  const r = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('streaming with include_usage equals the non-streaming reply', { skip }, async () => {
  const whole = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 20, temperature: 0 });
  const stream = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    } else {
      usage = chunk.usage;
    }
  }
  assert.ok(chunks >= 3);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.deepEqual(usage.completion_tokens, whole.usage.completion_tokens);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, 'second identical prompt hits the prefix cache');
});

test('stream helper accumulates the final message', { skip }, async () => {
  const runner = client.beta.chat.completions.stream({ model: 'stories', messages, max_tokens: 8, temperature: 0 });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.role, 'assistant');
  assert.equal(typeof final.choices[0].message.content, 'string');
});

// stories260K has a 512-token context and a 512-piece vocabulary, so the tool list is minimal.
test('tools are accepted and tool messages render', { skip }, async () => {
  const tools = [{ type: 'function', function: { name: 'w', parameters: { type: 'object' } } }];
  const r = await client.chat.completions.create({
    model: 'stories', max_tokens: 4, temperature: 0, tools,
    messages: [
      { role: 'user', content: 'Oslo?' },
      { role: 'assistant', content: null,
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'w', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '4' },
    ],
  });
  assert.equal(r.object, 'chat.completion');
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
});

test('completions endpoint and models list', { skip }, async () => {
  const c = await client.completions.create({ model: 'stories', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assert.equal(c.object, 'text_completion');
  assert.ok(c.choices[0].text.length > 0);
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  assert.deepEqual(models, ['stories260K-hf']);
  const one = await client.models.retrieve('stories260K-hf');
  assert.equal(one.id, 'stories260K-hf');
  assert.equal(one.object, 'model');
  assert.equal(one.owned_by, 'exlagent');
  await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e instanceof OpenAI.NotFoundError &&
    e.status === 404 && e.code === 'model_not_found' && /'gpt-4o'/.test(e.message));
});

test('logprobs: chat and completions, streamed and not, read by the SDK', { skip }, async () => {
  const whole = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = whole.choices[0].logprobs.content;
  assert.ok(content.length >= 1 && content.length <= 12);
  const bytes = [];
  for (const t of content) {
    assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob));
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6, 'greedy takes the most likely token');
    bytes.push(...t.bytes);
  }
  assert.equal(Buffer.from(bytes).toString('utf8'), whole.choices[0].message.content);

  const stream = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 2, stream: true,
  });
  const streamed = [];
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((t) => t.token), content.map((t) => t.token));
  streamed.forEach((t, i) => assert.ok(Math.abs(t.logprob - content[i].logprob) < 1e-6));

  const c = await client.completions.create({
    model: 'stories', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 3,
  });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.length, lp.top_logprobs.length);
  assert.equal(lp.text_offset[0], 0);
  assert.ok(Object.keys(lp.top_logprobs[0]).length >= 1 && Object.keys(lp.top_logprobs[0]).length <= 3);
  const plain = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 2 });
  assert.equal(plain.choices[0].logprobs, null);
});

test('errors surface as SDK errors with OpenAI fields', { skip }, async () => {
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: client.baseURL, maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 &&
    e.code === 'invalid_api_key');
  await assert.rejects(client.chat.completions.create({ model: 'stories', messages, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(client.chat.completions.create({
    model: 'stories', messages,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema: { properties: { a: { $recursiveRef: '#meta' } } } } },
  }), (e) => e instanceof OpenAI.BadRequestError && e.type === 'invalid_request_error' && e.param === 'response_format' &&
    /'\$recursiveRef'/.test(e.message) && /\/properties\/a/.test(e.message));
  const ok = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 2 });
  assert.equal(ok.object, 'chat.completion');
});

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const storySchema = {
  type: 'object',
  properties: {
    hero: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 1, maximum: 12 },
    mood: { enum: ['happy', 'sad', 'brave'] },
    friends: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 2 },
    day: { type: 'string', format: 'date' },
  },
  required: ['hero', 'age', 'mood', 'friends', 'day'],
  additionalProperties: false,
};

test('response_format json_schema: every reply validates with ajv', { skip }, async () => {
  const validate = ajv.compile(storySchema);
  for (let seed = 1; seed <= 8; seed++) {
    const r = await client.chat.completions.create({
      model: 'stories', messages, max_tokens: 200, temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'story', schema: storySchema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', `seed ${seed}`);
    const value = JSON.parse(r.choices[0].message.content);
    assert.ok(validate(value), `seed ${seed}: ${r.choices[0].message.content} ${JSON.stringify(validate.errors)}`);
  }
  const obj = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 40, temperature: 0, response_format: { type: 'json_object' },
  });
  if (obj.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(obj.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.equal(obj.choices[0].finish_reason, 'length');
    assert.equal(obj.choices[0].message.content[0], '{');
  }
});

// The ChatML tool preamble alone nearly fills stories260K's 512-token context, so the tool-call
// test serves the same model with the much shorter Mistral template ([TOOL_CALLS] syntax).
async function startServer(extra) {
  const proc = spawn(bin, ['serve', '--model', modelDir, '--port', '0', '--api-key', KEY, '--threads', '1', ...extra],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  const port = await new Promise((resolve, reject) => {
    let err = '';
    proc.stderr.on('data', (d) => {
      err += d;
      const m = err.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`server exited (${code}): ${err}`)));
  });
  return { proc, client: new OpenAI({ apiKey: KEY, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 }) };
}

const weatherTools = [
  { type: 'function', function: { name: 'w',
    parameters: { type: 'object', properties: { c: { type: 'string', maxLength: 4 } }, required: ['c'],
      additionalProperties: false } } },
];

// Mistral has a native tool format; Llama 2 gets the generic <tool_call>{..}</tool_call> one.
for (const template of ['mistral', 'llama2']) {
  test(`tool_choice required / named (${template}): every reply is a valid tool call`, { skip }, async () => {
    const { proc, client: served } = await startServer(['--chat-template', template]);
    try {
      const validators = Object.fromEntries(weatherTools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
      const choices = ['required', { type: 'function', function: { name: 'w' } }];
      for (const tool_choice of choices) {
        for (let seed = 1; seed <= 5; seed++) {
          const r = await served.chat.completions.create({
            model: 'stories', temperature: 1, seed, tools: weatherTools, tool_choice, parallel_tool_calls: false,
            messages: [{ role: 'user', content: 'Oslo?' }],
          });
          const c = r.choices[0];
          assert.equal(c.finish_reason, 'tool_calls', `seed ${seed}: ${JSON.stringify(c.message)}`);
          assert.equal(c.message.tool_calls.length, 1);
          for (const call of c.message.tool_calls) {
            assert.equal(call.type, 'function');
            assert.equal(call.function.name, 'w');
            const validate = validators[call.function.name];
            assert.ok(validate, `unknown tool ${call.function.name}`);
            const args = JSON.parse(call.function.arguments);
            assert.ok(validate(args), `${call.function.arguments} ${JSON.stringify(validate.errors)}`);
          }
        }
      }
    } finally {
      const exited = new Promise((resolve) => proc.on('exit', resolve));
      proc.kill('SIGTERM');
      await exited;
    }
  });
}

test('n = 3: three choices, streamed and not, read by the SDK', { skip }, async () => {
  const whole = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 10, temperature: 1, seed: 5, n: 3,
  });
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2]);
  const texts = whole.choices.map((c) => c.message.content);
  assert.equal(new Set(texts).size, 3, `choices differ: ${JSON.stringify(texts)}`);
  whole.choices.forEach((c) => assert.ok(['stop', 'length'].includes(c.finish_reason)));
  assert.ok(whole.usage.completion_tokens >= 3 && whole.usage.completion_tokens <= 30);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 10, temperature: 1, seed: 5, n: 3, stream: true,
    stream_options: { include_usage: true },
  });
  const streamed = ['', '', ''];
  const finish = [null, null, null];
  let usage = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      streamed[c.index] += c.delta.content ?? '';
      finish[c.index] = c.finish_reason ?? finish[c.index];
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.deepEqual(streamed, texts, 'a seeded request is reproducible');
  assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);

  const c = await client.completions.create({ model: 'stories', prompt: 'Once upon a time', max_tokens: 6, n: 3, seed: 2, temperature: 1 });
  assert.deepEqual(c.choices.map((x) => x.index), [0, 1, 2]);
  await assert.rejects(client.chat.completions.create({ model: 'stories', messages, n: 17 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
});

test('responses.create: text and a json_schema format', { skip }, async () => {
  const r = await client.responses.create({
    model: 'stories', instructions: 'You tell short stories for small children.',
    input: 'Tell me a story about a brave little dog.', max_output_tokens: 12, temperature: 0,
  });
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'));
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output_text, r.output[0].content[0].text);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  const chat = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.output_text, chat.choices[0].message.content, 'the same generation as chat completions');

  const validate = ajv.compile(storySchema);
  const j = await client.responses.create({
    model: 'stories', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me a story.' }] }],
    max_output_tokens: 200, temperature: 1,
    text: { format: { type: 'json_schema', name: 'story', schema: storySchema, strict: true } },
  });
  assert.equal(j.status, 'completed');
  assert.ok(validate(JSON.parse(j.output_text)), `${j.output_text} ${JSON.stringify(validate.errors)}`);
  await assert.rejects(client.responses.create({ model: 'stories', input: 'x', previous_response_id: 'resp_1' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
});

test('responses.stream: deltas and the final response', { skip }, async () => {
  const stream = client.responses.stream({
    model: 'stories', instructions: 'You tell short stories for small children.',
    input: 'Tell me a story about a brave little dog.', max_output_tokens: 12, temperature: 0,
  });
  let text = '';
  const types = [];
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  for await (const e of stream) types.push(e.type);
  const final = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  assert.ok(text.length > 0);
  assert.equal(final.output[0].content[0].text, text);
  const whole = await client.responses.create({
    model: 'stories', instructions: 'You tell short stories for small children.',
    input: 'Tell me a story about a brave little dog.', max_output_tokens: 12, temperature: 0,
  });
  assert.equal(whole.output_text, text);
});

test('responses: a function call round trip (call, function_call_output, answer), streamed too', { skip }, async () => {
  const { proc, client: served } = await startServer(['--chat-template', 'mistral']);
  try {
    const tools = [{ type: 'function', name: 'w', strict: true, parameters: weatherTools[0].function.parameters }];
    const input = [{ role: 'user', content: 'Oslo?' }];
    const first = await served.responses.create({
      model: 'stories', input, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0,
    });
    const calls = first.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(first.output));
    assert.equal(calls[0].name, 'w');
    assert.ok(ajv.compile(weatherTools[0].function.parameters)(JSON.parse(calls[0].arguments)));
    const next = [...input, calls[0], { type: 'function_call_output', call_id: calls[0].call_id, output: '4 degrees' }];
    const answer = await served.responses.create({
      model: 'stories', input: next, tools, tool_choice: 'none', max_output_tokens: 8, temperature: 0,
    });
    assert.equal(answer.output[0].type, 'message');
    assert.equal(typeof answer.output_text, 'string');
    assert.ok(!answer.output_text.includes('[TOOL_CALLS]'));

    const stream = served.responses.stream({
      model: 'stories', input, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0,
    });
    let args = '';
    stream.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
    const final = await stream.finalResponse();
    const streamedCalls = final.output.filter((o) => o.type === 'function_call');
    assert.equal(streamedCalls.length, 1);
    assert.equal(args, streamedCalls[0].arguments);
    assert.equal(streamedCalls[0].arguments, calls[0].arguments);
  } finally {
    const exited = new Promise((resolve) => proc.on('exit', resolve));
    proc.kill('SIGTERM');
    await exited;
  }
});

test('parallel_tool_calls false: tool_choice auto replies hold at most one call', { skip }, async () => {
  const { proc, client: served } = await startServer(['--chat-template', 'llama2']);
  try {
    for (let seed = 1; seed <= 4; seed++) {
      const r = await served.chat.completions.create({
        model: 'stories', temperature: 1, seed, tools: weatherTools, parallel_tool_calls: false, max_tokens: 60,
        messages: [{ role: 'user', content: 'Oslo?' }],
      });
      assert.ok((r.choices[0].message.tool_calls ?? []).length <= 1, JSON.stringify(r.choices[0].message));
      assert.ok(!(r.choices[0].message.content ?? '').includes('<tool_call>'));
    }
  } finally {
    const exited = new Promise((resolve) => proc.on('exit', resolve));
    proc.kill('SIGTERM');
    await exited;
  }
});
