#!/usr/bin/env bash
# Runs fuzz targets with libFuzzer for a while each (a build configured with -DEXLAGENT_FUZZ=ON):
#   tests/fuzz/run_libfuzzer.sh BUILD_DIR SECONDS [TARGET...]   (default: every target)
# Each target's corpus lives in BUILD_DIR/fuzz-corpus/<target>, seeded from tests/fuzz/seeds/<target>/
# and the files named in seeds/<target>.list; findings (crash-*, timeout-*, oom-*) land in
# BUILD_DIR/fuzz-findings/<target>. Two targets run at a time, niced.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"; secs="$2"; shift 2
shared="${EXL_SHARED_DIR:-$src/../shared}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=($(sed -n 's/^exl_fuzz_target(\([a-z_]*\) .*/\1/p' "$src/tests/CMakeLists.txt"))
fi
run_one() {
  local t=$1 corpus="$build/fuzz-corpus/$1" findings="$build/fuzz-findings/$1"
  mkdir -p "$corpus" "$findings"
  [ -d "$src/tests/fuzz/seeds/$t" ] && cp -n "$src/tests/fuzz/seeds/$t"/* "$corpus"/ 2>/dev/null || true
  if [ -f "$src/tests/fuzz/seeds/$t.list" ]; then
    grep -v '^#' "$src/tests/fuzz/seeds/$t.list" | while read -r p; do
      case "$p" in ../shared/*) f="$shared/${p#../shared/}" ;; *) f="$src/$p" ;; esac
      [ -f "$f" ] && cp -n "$f" "$corpus/seed-$(echo "$p" | tr '/' '_')" || true
    done
  fi
  (cd "$findings" && nice -n 10 "$build/tests/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 \
     -max_len=65536 -print_final_stats=1 "$corpus" >"$build/fuzz-findings/$t.log" 2>&1) || true
  echo "$t: $(grep -E '^stat::number_of_executed_units' "$build/fuzz-findings/$t.log" | awk '{print $2}') execs," \
       "$(ls "$findings" | wc -l) findings, corpus $(ls "$corpus" | wc -l)"
}
i=0
for t in "${targets[@]}"; do
  run_one "$t" &
  i=$((i + 1))
  if [ $((i % 2)) -eq 0 ]; then wait; fi
done
wait
