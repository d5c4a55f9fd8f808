#!/bin/sh
# Trains the larger model of the draft/target pair (issue #23): ~75M parameters, the demo model's
# tokenizer and data (same seed), on a GPU; the committed demo model (model/) is its draft:
#   exlagent batch --model OUT --draft-model examples/demo-model/model --speculate draft ...
# Usage: train_target.sh OUT [MINUTES]
set -e
here=$(dirname "$0")
python3 "$here/train.py" --out "$1" --tokenizer "$here/model/tokenizer.model" --seed 1 \
  --hidden 768 --intermediate 2048 --layers 10 --heads 12 --kv-heads 4 --lr 1e-3 --warmup 100 \
  --steps 0 --minutes "${2:-4.5}" --eval-count 30
