#!/usr/bin/env bash
# WebSocket tool clients (Node `ws` and C++ Beast) against `exlagent serve` on the embedded demo
# model: each client registers `get_weather`, asks "What is the weather like in Oslo?", answers the
# model's tool call and prints the final answer. Usage: run.sh [node|cpp|both] (default both).
# EXLAGENT overrides the server binary, WS_TOOL_CLIENT the C++ client (default build/ws_tool_client,
# built when missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
which="${1:-both}"
exe="${EXLAGENT:-$root/build/exlagent}"
cpp_client="${WS_TOOL_CLIENT:-$(dirname "$exe")/ws_tool_client}"
key="example-key-$$"

if [ "$which" != cpp ] && [ ! -d "$here/node_modules/ws" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ "$which" != node ] && [ ! -x "$cpp_client" ]; then
  cmake --build "$(dirname "$cpp_client")" --target ws_tool_client >&2
fi

. "$here/../start-server.sh"
start_server --model "$here/../demo-model/model" --api-key "$key" --threads 1

if [ "$which" != cpp ]; then
  echo "== node client.mjs"
  node "$here/client.mjs" --url "ws://127.0.0.1:$port/v1/ws" --key "$key"
fi
if [ "$which" != node ]; then
  echo "== C++ ws_tool_client"
  "$cpp_client" --port "$port" --key "$key"
fi
