#!/bin/sh
# Rebuilds issue #23's draft-model pair and measures it: trains the larger model (train_target.sh,
# seed 1; MINUTES of training on a GPU), then extracts the first COUNT held-out documents with it
# on the GPU, without speculation and with the committed demo model (model/) drafting, and checks
# that both outputs are the same. Prints each run's `exlagent batch` summary (tok/s, drafted and
# accepted tokens, tokens per forward pass). Needs python3 with PyTorch and a CUDA GPU.
# Usage: draft_pair.sh OUT [MINUTES] [COUNT]    (EXLAGENT: the binary, default exlagent)
set -e
here=$(dirname "$0")
out=$1
exlagent=${EXLAGENT:-exlagent}
mkdir -p "$out"
sh "$here/train_target.sh" "$out/target" "${2:-2}" > "$out/train.log" 2>&1 || { tail -20 "$out/train.log"; exit 1; }
python3 "$here/heldout_batch.py" --count "${3:-48}" --out "$out/docs.jsonl"
for mode in none draft; do
  echo "== --speculate $mode"
  rm -f "$out/$mode.jsonl"
  "$exlagent" batch --backend cuda --model "$out/target" --draft-model "$here/model" --input "$out/docs.jsonl" \
    --output "$out/$mode.jsonl" --concurrency 1 --quiet --speculate "$mode"
done
cmp "$out/none.jsonl" "$out/draft.jsonl"
echo "outputs identical"
