#!/usr/bin/env bash
# Packs .gpu/ for the device tool's `run` (carry [".gpu"], under 64 MiB): exlagent and the GPU
# test programs of a Release build (stripped, xz'd; issue21_bench.sh unpacks them), the shared
# assets the GPU tests read (tokenizers, stories260K, exl2-ref) as data/shared-min.tar.xz,
# llama.cpp's peer folder as peer/, and BUILT_FROM (the commit, "+dirty" with uncommitted changes).
#
#   tests/gpu/bundle.sh [BUILD_DIR]        (default: build)
#   TEST_PROGS="exl_kernels_tests" tests/gpu/bundle.sh   (the test programs carried; default both:
#                                        drop one when the tree would pass 64 MiB)
#   EXL2_REF=0 tests/gpu/bundle.sh        (shared-min without data/exl2-ref, 20 MiB less: the engine
#                                        tests' reference models; the kernel tests do not read it)
#
# Then, in one device call: source .gpu/env.sh; PEER=.gpu/peer bash tests/gpu/issue21_bench.sh $OUT
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
shared="$(cd "${EXL_SHARED_DIR:-$root/../shared}" && pwd)"
cd "$root"
progs=("$build/exlagent")
for t in ${TEST_PROGS-exl_kernels_tests exl_engine_tests}; do [ -x "$build/tests/$t" ] && progs+=("$build/tests/$t"); done
"$shared/tools/gpu-bundle" "${progs[@]}" >/dev/null
(cd .gpu/bin && strip ./* && xz -T2 -6 ./*)
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/shared-min/models" "$staging/shared-min/data"
for m in llama2-tokenizer llama3-tokenizer stories260K stories260K-hf; do
  cp -r "$shared/models/$m" "$staging/shared-min/models/"
done
[ "${EXL2_REF:-1}" = 0 ] || cp -r "$shared/data/exl2-ref" "$staging/shared-min/data/"
tar -C "$staging" -cJf .gpu/data/shared-min.tar.xz shared-min
[ -d "$shared/peers/llama.cpp" ] && cp -r "$shared/peers/llama.cpp" .gpu/peer
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo +dirty)" > .gpu/BUILT_FROM
size=$(du -sm .gpu | cut -f1)
echo "bundle: .gpu is ${size} MiB, built from $(cat .gpu/BUILT_FROM)"
[ "$size" -le 64 ] || { echo "bundle: over the 64 MiB that travels" >&2; exit 1; }
