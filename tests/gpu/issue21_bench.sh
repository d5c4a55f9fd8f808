#!/usr/bin/env bash
# Issue #21's measurements in one device call: the kernel tests, then `exlagent bench` on the
# llama2-7b and llama3-8b shapes (synth, 4.0 bpw) under each tensor-core form named in FORMS, and
# llama.cpp's bench on the same llama2-7b shape when PEER names a copy of ../shared/peers/llama.cpp
# (built in the background while the tests run, then benchmarked alone, before exlagent).
#
#   source .gpu/env.sh; bash tests/gpu/issue21_bench.sh OUT_DIR
#
# Everything at once may not fit one call's 10 minutes; what finished is in OUT_DIR either way
# (each section prints its start time in seconds). Two calls that do fit (peer beside exlagent in
# the first, as issue #21 asks; with less device time left, QUICK=1 and no PEER first):
#   TESTS=0 ROUNDS=1 PROFILE=1 PEER=.gpu/peer bash tests/gpu/issue21_bench.sh $OUT
#   ROUNDS=1 SWEEP="2 3 4 6" bash tests/gpu/issue21_bench.sh $OUT
#
# Expects the bundle of tests/gpu/bundle.sh (its xz'd programs and shared assets are unpacked here)
# or exlagent on PATH. Environment:
#   FORMS   space-separated: narrow (the defaults), unchained (EXL_CUDA_LAYER_CHAINS=0 and
#           EXL_CUDA_MMA_STREAM_K=0: each op stages its own tensor-core input and K-slices
#           everywhere, the code before session 30), chained (the layer chains at every row count,
#           as session 30 had them), or VAR=value[+VAR=value...] (the defaults with those
#           variables set); default "narrow unchained"
#   PEER    a copied peer folder (e.g. .gpu/peer); unset: no llama.cpp
#   TESTS=0 skip the kernel and engine GPU tests
#   TEST_FORMS  the forms the tests run under (default: FORMS)
#   ROUNDS  bench runs per form and shape (default 2), interleaved across forms
#   QUICK=1 decode only (no prefill and prefix cases)
#   CASES   bench arguments replacing the prefill and prefix cases (e.g. "--prefix-len 4096
#           --suffix-len 64"; with QUICK=1 ignored)
#   L3_BATCHES, L2_BATCHES  decode batch sizes per shape (defaults 1,4,8,16,32,64 and 1,8,32; empty:
#           the shape is skipped)
#   BASE    another exlagent binary, run as form "base" (its own defaults) where FORMS names it
#   SWEEP   EXL_CUDA_MMA_BLOCKS_PER_SM values to try on llama3-8b per form (e.g. "2 3 4 6")
#   PROFILE=1  after the rounds, EXL_CUDA_PROFILE=1 op tables (llama3-8b) of decode at b=8 and
#           b=64 and of the 64-token suffix on a 4,096-token prefix (profile-*.txt in results.tgz)
#   PROFILE_FORMS  the forms profiled (default: the first of FORMS)
# Writes OUT_DIR/log.txt (everything) and OUT_DIR/results.tgz (each bench run's JSON and stderr).
set -uo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
forms=${FORMS:-narrow unchained}
rounds=${ROUNDS:-2}
work=${WORK:-/tmp/issue21}
mkdir -p "$work"
# The synthetic models (~4 GB each) in memory where it can: written to the device's disk, the two
# took ~4 minutes of a call.
shm_gb=$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
models=${MODELS:-$([ "${shm_gb:-0}" -ge 12 ] && echo /dev/shm/issue21 || echo "$work")}
mkdir -p "$models"
# Each run's JSON and stderr go to $res, packed into OUT_DIR/results.tgz after every run (the
# device returns only a few files per call).
res=$work/results
mkdir -p "$res"
pack() { tar -C "$work" -czf "$out/results.tgz" results; }

for f in "${GPU_DATA:-/nonexistent}"/../bin/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
if [ -z "${EXL_SHARED_DIR:-}" ] && [ -f "${GPU_DATA:-/nonexistent}/shared-min.tar.xz" ]; then
  tar -C "$work" -xJf "$GPU_DATA/shared-min.tar.xz"
  export EXL_SHARED_DIR=$work/shared-min
fi
command -v exlagent >/dev/null || { echo "issue21_bench: exlagent is not on PATH"; exit 2; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "built from: $(cat "${GPU_DATA:-/nonexistent}/../BUILT_FROM" 2>/dev/null || echo unknown)"

form_env() {
  case "$1" in
    narrow | default | base) ;;
    unchained) echo EXL_CUDA_LAYER_CHAINS=0 EXL_CUDA_MMA_STREAM_K=0 ;;
    chained) echo EXL_CUDA_LAYER_CHAINS=1000000 ;;
    *=*) echo "${1//+/ }" ;;
    *) echo "issue21_bench: unknown form '$1'" >&2; exit 2 ;;
  esac
}

# The peer's script builds, makes its GGUF, then benchmarks: the first run stops once its benchmark
# starts (its output file appears), so that the measured run later has the GPU alone.
peer_pid=""
if [ -n "${PEER:-}" ]; then
  (
    setsid bash -c 'PEER_WORK=$0/peer bash "$1/bench.sh" "$0/peer-prebuild"' "$work" "$PEER" >"$work/peer-build.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ ! -e "$work/peer-prebuild/llama-bench.txt" ]; do sleep 2; done
    kill -- -"$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  ) &
  peer_pid=$!
fi

section() { echo "== [${SECONDS}s] $*"; }

section "synth (in the background)"
# Both at once (each is mostly one thread), beside the tests; bench needs each shape's real tokenizer.
tok=${EXL_SHARED_DIR:-$(dirname "$0")/../../../shared}/models
synth_pids=()
for m in "l2 llama2-7b llama2-tokenizer" "l3 llama3-8b llama3-tokenizer"; do
  read -r dir shape tk <<<"$m"
  [ -d "$models/$dir" ] ||
    { exlagent synth "$models/$dir" --shape "$shape" --bpw 4.0 --tokenizer "$tok/$tk" >"$res/synth-$dir.log" 2>&1 & synth_pids+=("$!:$dir"); }
done

for f in ${TEST_FORMS:-$forms}; do
  [ "${TESTS:-1}" = 0 ] && break
  if command -v exl_kernels_tests >/dev/null; then
    section "kernel tests, $f"
    env $(form_env "$f") exl_kernels_tests --gtest_filter='*Cuda*' 2>&1 | grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]'
  fi
  if command -v exl_engine_tests >/dev/null; then
    section "engine GPU tests, $f"
    env $(form_env "$f") exl_engine_tests --gtest_filter='*Cuda*:*KvPrecision*:*DeviceSampling*' 2>&1 |
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]'
  fi
done

for p in "${synth_pids[@]}"; do wait "${p%%:*}" || { echo "synth ${p#*:} failed:"; tail -3 "$res/synth-${p#*:}.log"; }; done
section "synth done"

if [ -n "$peer_pid" ]; then
  wait "$peer_pid"
  section "llama.cpp c392e50 (Q4_0, llama2-7b shape)"
  PEER_WORK=$work/peer bash "$PEER/bench.sh" "$out/peer"
fi

exl_bench() {  # form model args...: exlagent bench on the device under the form's environment
  local f=$1 model=$2
  shift 2
  local prog=exlagent
  [ "$f" = base ] && prog=${BASE:?BASE names the base binary}
  env $(form_env "$f") "$prog" bench --model "$model" --backend cuda --context 128 "$@"
}

bench() {  # form name model batches extra...
  local f=$1 name=$2 model=$3 batches=$4
  shift 4
  exl_bench "$f" "$model" --batch "$batches" --decode-steps 32 --repeat 3 "$@" --json >"$res/$name.json" 2>"$res/$name.err" ||
    { echo "$name: failed"; tail -3 "$res/$name.err"; pack; return; }
  pack
  python3 - "$res/$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
parts = []
for d in r.get("decode", []):
    parts.append(f"b={d['batch']} {d['tokens_per_s']:.1f}")
for p in r.get("prefill", []):
    parts.append(f"pp{p['tokens']} {p['tokens_per_s']:.0f}")
pc = r.get("prefix_cache")
if pc:
    parts.append(f"prefix TTFT warm {pc['warm_ttft_s'] * 1e3:.2f} ms (median of {pc['warm_runs']} "
                 f"{pc['warm_ttft_median_s'] * 1e3:.2f}), cold {pc['cold_ttft_s'] * 1e3:.1f}")
print(sys.argv[2] + ": " + ", ".join(parts) if parts else sys.argv[2] + ": " + json.dumps(r)[:400])
PY
}

for round in $(seq 1 "$rounds"); do
  for f in $forms; do
    section "round $round, $f"
    l3=${L3_BATCHES-1,4,8,16,32,64} l2=${L2_BATCHES-1,8,32}
    [ -z "$l3" ] || bench "$f" "l3-$f-$round" "$models/l3" "$l3" \
      $([ "${QUICK:-0}" = 1 ] || echo "${CASES:---prefill 2048 --prefix-len 4096 --suffix-len 64}")
    [ -z "$l2" ] || bench "$f" "l2-$f-$round" "$models/l2" "$l2" \
      $([ "${QUICK:-0}" = 1 ] || echo "${CASES:---prefill 128,2048 --prefix-len 4096 --suffix-len 64}")
  done
done

profile() {  # name form args...
  local name=$1 f=$2
  shift 2
  section "profile $name, $f"
  EXL_CUDA_PROFILE=1 exl_bench "$f" "$models/l3" "$@" >"$res/profile-$name.json" 2>"$res/profile-$name.txt" || echo "profile $name: failed"
  pack
  head -40 "$res/profile-$name.txt"
}
if [ "${PROFILE:-0}" = 1 ]; then
  for pf in ${PROFILE_FORMS:-${forms%% *}}; do
    tag=$(echo "$pf" | tr -c 'A-Za-z0-9_\n' -)
    profile "b8-$tag" "$pf" --batch 8 --decode-steps 16 --repeat 1
    profile "b64-$tag" "$pf" --batch 64 --decode-steps 16 --repeat 1
    profile "prefix-$tag" "$pf" --batch 1 --decode-steps 1 --repeat 2 --prefix-len 4096 --suffix-len 64
  done
fi

for n in ${SWEEP:-}; do
  for f in $forms; do
    section "EXL_CUDA_MMA_BLOCKS_PER_SM=$n, $f"
    EXL_CUDA_MMA_BLOCKS_PER_SM=$n bench "$f" "l3-$f-bps$n" "$models/l3" 8,16,32,64
  done
done
section "done"
