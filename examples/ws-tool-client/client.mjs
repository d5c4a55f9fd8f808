// A WebSocket tool client for exlagent in Node (npm `ws`): it registers a `get_weather` tool, opens
// an agent session that may call it, asks a question, answers the runtime's tools/call requests and
// prints the session's tool calls and final answer.
//
//   node client.mjs --url ws://127.0.0.1:8421/v1/ws [--key KEY] [--question TEXT]
//
// Exit status 0 when the session ends with a final answer, 1 otherwise.
import WebSocket from 'ws';

function option(name, fallback) {
  const i = process.argv.indexOf(name);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}
const url = option('--url', 'ws://127.0.0.1:8421/v1/ws');
const key = option('--key', process.env.EXLAGENT_API_KEY);
const question = option('--question', 'What is the weather like in Oslo?');

// The tool's data: a fixed table, so the example's output is reproducible.
const WEATHER = { Oslo: [4, 'cloudy'], Lisbon: [21, 'sunny'], Tokyo: [12, 'rainy'] };
const getWeather = {
  name: 'get_weather',
  description: 'Current weather in a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  call({ city }) {
    const w = WEATHER[city];
    if (!w) return { content: [{ type: 'text', text: `no weather data for '${city}'` }], isError: true };
    return { content: [{ type: 'text', text: `{"city": "${city}", "temperature_c": ${w[0]}, "sky": "${w[1]}"}` }],
             isError: false };
  },
};

const ws = new WebSocket(url, 'exlagent.v1', { headers: key ? { Authorization: `Bearer ${key}` } : {} });
let nextId = 1;
const pending = new Map();
function call(method, params) {
  const id = nextId++;
  ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
  return new Promise((resolve, reject) => pending.set(id, (msg) =>
    msg.error ? reject(new Error(`${method}: ${msg.error.message}`)) : resolve(msg.result)));
}

let sessionId = null;
ws.on('message', (data) => {
  const msg = JSON.parse(data.toString());
  if (msg.method === undefined) {                       // a response to one of our requests
    pending.get(msg.id)?.(msg);
    pending.delete(msg.id);
  } else if (msg.method === 'tools/call') {             // the runtime calls our tool
    const result = msg.params.name === getWeather.name
      ? getWeather.call(msg.params.arguments)
      : { content: [{ type: 'text', text: `unknown tool ${msg.params.name}` }], isError: true };
    ws.send(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result }));
  } else if (msg.method === 'sessions/event' && msg.params.sessionId === sessionId) {
    const e = msg.params;
    if (e.type === 'tool_call') console.log(`tool_call ${e.name} ${JSON.stringify(e.arguments)}`);
    if (e.type === 'tool_result') console.log(`tool_result ${e.isError ? '(error) ' : ''}${e.content}`);
    if (e.type === 'error') console.error(`error: ${e.message}`);
    if (e.type === 'done') {
      if (e.reason === 'final') console.log(`answer: ${e.content}`);
      else console.error(`session ended: ${e.reason}`);
      ws.close();
      process.exitCode = e.reason === 'final' ? 0 : 1;
    }
  }
});
ws.on('error', (err) => {
  console.error(`client: ${err.message}`);
  process.exit(1);
});
ws.on('open', async () => {
  try {
    const { inputSchema, name, description } = getWeather;
    await call('tools/register', { tools: [{ name, description, inputSchema }] });
    ({ sessionId } = await call('sessions/create', {
      system: 'You are a helpful assistant.', tools: ['get_weather'], maxTokens: 96,
      sampling: { temperature: 0 } }));
    await call('sessions/send', { sessionId, content: question });
  } catch (err) {
    console.error(`client: ${err.message}`);
    process.exit(1);
  }
});
