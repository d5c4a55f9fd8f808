#!/usr/bin/env bash
# The batch example: five extraction requests (simple and OpenAI batch forms) through the demo
# model, results appended to OUT (default: /tmp/exlagent-batch-example.jsonl). Re-running resumes:
# requests already in OUT are skipped. EXLAGENT overrides the binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exe="${EXLAGENT:-$here/../../build/exlagent}"
out="${1:-/tmp/exlagent-batch-example.jsonl}"
"$exe" batch --model "$here/../demo-model/model" --input "$here/input.jsonl" --output "$out" --concurrency 4
cat "$out"
