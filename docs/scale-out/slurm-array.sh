#!/bin/bash
# One shard of a grpo-conform check per Slurm array task (docs/scale-out.md). Submit it with
# slurm-submit.sh, which also queues slurm-merge.sh behind it. The array runs 1..N, so the task id
# is the shard index as `--shard` counts it.
#SBATCH --job-name=grpo-conform-shard
#SBATCH --array=1-4
#SBATCH --gres=gpu:1
#SBATCH --time=02:00:00
#SBATCH --output=grpo-conform-shard-%A-%a.log
set -uo pipefail

OUT=${GRPO_CONFORM_OUT:?set GRPO_CONFORM_OUT to a folder every node can reach (slurm-submit.sh does)}
GRPO_CONFORM=${GRPO_CONFORM:-grpo-conform}
# What to check: the same on every task (the split is computed from it on every node).
CHECK_ARGS=${GRPO_CONFORM_CHECK_ARGS:-implementations/ --device cuda}

I=$SLURM_ARRAY_TASK_ID
N=$SLURM_ARRAY_TASK_COUNT
BUNDLE="$OUT/shard-$I"  # the shard's report and its signed records, self-contained
mkdir -p "$BUNDLE"
# shellcheck disable=SC2086  # GRPO_CONFORM and CHECK_ARGS are word lists
$GRPO_CONFORM check $CHECK_ARGS --shard "$I/$N" --evidence-dir "$BUNDLE" \
    --format json > "$BUNDLE/report.json"
code=$?
# 0: conformant; 1: a failure found, and the report says which. Both are a finished shard, and
# strictness is judged on the merge. Anything else (2 usage, 3 nothing could run here, 143
# killed) fails the task, so `afterok` holds the merge back and no verdict is made from a hole.
if [ "$code" -le 1 ]; then exit 0; fi
exit "$code"
