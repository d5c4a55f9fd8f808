#!/bin/bash
# sbatch --array=0-3 slurm-array.sh   (N = 4 tasks; the output of task I is out/results-I.jsonl)
# A requeued task resumes its output file.
#SBATCH --job-name=exlagent-batch
#SBATCH --gres=gpu:1
#SBATCH --time=04:00:00
#SBATCH --output=out/slurm-%A_%a.log
set -euo pipefail
I=${SLURM_ARRAY_TASK_ID:?run with sbatch --array=0-(N-1)}
N=${SLURM_ARRAY_TASK_COUNT:?run with sbatch --array}
mkdir -p out
exec exlagent batch --backend cuda \
  --model /shared/models/my-model \
  --input /shared/jobs/requests.jsonl \
  --output "out/results-$I.jsonl" \
  --shard "$I/$N"
