#!/usr/bin/env bash
# The workflow example: a company profile, then each of its invoices (for_each), then its launch
# event when the company is a robotics firm (if). Step outputs and the trace go to OUT (default
# /tmp/exlagent-workflow-example); outputs.json is printed. EXLAGENT overrides the binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exe="${EXLAGENT:-$here/../../build/exlagent}"
exec "$exe" run "$here/workflow.json" --out "${1:-/tmp/exlagent-workflow-example}"
