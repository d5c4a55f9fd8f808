#!/usr/bin/env bash
# Issue #22's GPU target: an FP16 Llama-2-7B-shaped checkpoint with random weights (made here with
# torch + transformers, seeded, N(0, 0.02) as LlamaForCausalLM initializes, created on the GPU in
# fp16) converted to EXL2 at 4.0 bpw by `exlagent quantize --backend cuda`, measurement included;
# prints the seconds per phase, the total against the 15-minute target, peak host RSS and peak GPU
# memory. Needs python3 with torch and transformers, a CUDA device, no network.
#
#   tests/gpu/convert_llama2_7b.sh [EXLAGENT [WORK_DIR]]     (defaults: build/exlagent, /tmp/llama2-7b-convert)
#
# Environment: LAYERS (32; fewer for a quick smoke run), BPW (4.0), BACKEND (cuda), SEED (0),
# EXTRA (more quantize options, e.g. "--cal-rows 64"), MAKE_ONLY=1 (make the checkpoint and stop),
# RESUME=1 (keep an interrupted conversion's WORK_DIR/.q-BPW.partial: the job resumes from it, and
# the phases it had finished report next to nothing). The checkpoint is reused when WORK_DIR/hf exists with the
# same LAYERS and SEED; the output WORK_DIR/q-BPW is replaced. To stay under a 10-minute limit per
# command: MAKE_ONLY=1 first, then the conversion.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exlagent="$(realpath "${1:-$root/build/exlagent}")"
work="${2:-/tmp/llama2-7b-convert}"
layers="${LAYERS:-32}"
bpw="${BPW:-4.0}"
backend="${BACKEND:-cuda}"
seed="${SEED:-0}"
shared="${EXL_SHARED_DIR:-$root/../shared}"
mkdir -p "$work"
hf="$work/hf"
stamp="layers=$layers seed=$seed"

if [[ ! -f "$hf/.made" || "$(cat "$hf/.made")" != "$stamp" ]]; then
  rm -rf "$hf"
  t0=$EPOCHREALTIME
  python3 - "$hf" "$layers" "$seed" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, layers, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  rope_theta=10000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  initializer_range=0.02)
torch.manual_seed(seed)
torch.set_default_dtype(torch.float16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg)
with torch.no_grad():  # the same init whatever the transformers version does at construction
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.normal_(0.0, 0.02, generator=g)
        else:
            p.fill_(1.0)
try:
    model.save_pretrained(out, safe_serialization=True)
except TypeError:  # transformers 5 writes safetensors only and dropped the argument
    model.save_pretrained(out)
print(f"made {out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {layers} layers")
PY
  tok="$shared/models/llama2-tokenizer/tokenizer.model"
  if [[ -f "$tok" ]]; then
    cp "$tok" "$hf/"
  else
    echo "note: no llama2 tokenizer at $tok; the calibration takes BOS from config.json" >&2
  fi
  echo "$stamp" > "$hf/.made"
  python3 -c "import sys; print(f'checkpoint: {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$t0" "$EPOCHREALTIME" >&2
fi

[[ "${MAKE_ONLY:-0}" == 1 ]] && exit 0
out="$work/q-$bpw"
rm -rf "$out"
[[ "${RESUME:-0}" == 1 ]] || rm -rf "$work/.q-$bpw.partial"
mem_log="$work/gpu_mem.log"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 2000 > "$mem_log" 2>/dev/null &
smi=$!
trap 'kill $smi 2>/dev/null || true' EXIT
time_cmd=()
[[ -x /usr/bin/time ]] && time_cmd=(/usr/bin/time -f "peak host RSS: %M KiB" -o "$work/rss.txt")
t0=$EPOCHREALTIME
"${time_cmd[@]}" "$exlagent" quantize --in "$hf" --out "$out" --bpw "$bpw" --backend "$backend" ${EXTRA:-} \
  > "$work/report.json"
t1=$EPOCHREALTIME
kill $smi 2>/dev/null || true

python3 - "$work/report.json" "$t0" "$t1" "$mem_log" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
s = r["seconds"]
print(f"backend {r['backend']}, calibration: {r['calibration']}")
print(f"layers bpw {r['layers_bpw']:.4f} (target {r['target_bpw']}), head bpw {r['head_bpw']:.3f}, "
      f"mean rel error {r['mean_rel_error']:.4f}")
for k in ("calibrate", "measure", "quantize", "write", "total"):
    print(f"  {k:9s} {s[k]:8.1f} s")
for k, v in sorted(r.get("step_seconds", {}).items()):
    print(f"    {k:34s} {v:8.1f} s")
print(f"  wall      {wall:8.1f} s (process, loading included) -> {'within' if wall <= 900 else 'OVER'} 15 minutes")
try:
    used = [int(x) for x in open(sys.argv[4]).read().split() if x.strip().isdigit()]
    if used:
        print(f"peak GPU memory (nvidia-smi, 2 s samples): {max(used) / 1024:.1f} GiB")
except OSError:
    pass
PY
[[ -f "$work/rss.txt" ]] && cat "$work/rss.txt"
exit 0
