#!/usr/bin/env bash
# The JSON-extraction example: the invoice in input.txt, extracted under schema.json by the
# embedded demo model on the CPU; prints one JSON object. EXLAGENT overrides the binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exe="${EXLAGENT:-$here/../../build/exlagent}"
exec "$exe" extract --model "$here/../demo-model/model" --schema "$here/schema.json" "$here/input.txt"
