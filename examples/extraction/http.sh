#!/usr/bin/env bash
# The same extraction over the OpenAI-compatible HTTP API: starts `exlagent serve` on a free port,
# POSTs request.json (the conversation `extract` builds from schema.json and input.txt, with
# response_format json_schema) to /v1/chat/completions with curl, prints the reply's JSON content
# and stops the server. EXLAGENT overrides the binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exe="${EXLAGENT:-$here/../../build/exlagent}"
. "$here/../start-server.sh"
start_server --model "$here/../demo-model/model"
reply="$(curl -sS --fail-with-body -H 'Content-Type: application/json' --data-binary @"$here/request.json" \
  "http://127.0.0.1:$port/v1/chat/completions")" || { echo "$reply" >&2; exit 1; }
# The content is the JSON object; print it on its own line (node is installed by .ci/setup).
printf '%s' "$reply" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).choices[0].message.content))'
