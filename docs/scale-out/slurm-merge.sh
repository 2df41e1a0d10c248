#!/bin/bash
# The merge behind the shard array (slurm-submit.sh queues it with --dependency=afterok).
#SBATCH --job-name=grpo-conform-merge
#SBATCH --time=00:15:00
#SBATCH --output=grpo-conform-merge-%j.log
set -uo pipefail

OUT=${GRPO_CONFORM_OUT:?set GRPO_CONFORM_OUT to the folder the shards wrote}
GRPO_CONFORM=${GRPO_CONFORM:-grpo-conform}

# merge refuses a missing or duplicated shard and pieces from different GPUs or trees (exit 2).
# shellcheck disable=SC2086
$GRPO_CONFORM merge --strict "$OUT"/shard-*/report.json --junit-xml "$OUT/merged-junit.xml" \
    --summary "$OUT/merged.md" --format json > "$OUT/merged.json"
