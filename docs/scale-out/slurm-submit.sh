#!/bin/bash
# Queue the shard array and, behind it, the merge: the merge starts only when every shard task
# finished with exit 0 (afterok), and is cancelled when one did not (--kill-on-invalid-dep).
# Usage: slurm-submit.sh [OUTPUT_FOLDER]   (prints the merge's job id)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GRPO_CONFORM_OUT=$(realpath -m "${1:-grpo-conform-results/$(date -u +%Y%m%dT%H%M%SZ)}")
export GRPO_CONFORM_OUT  # sbatch passes the environment on (--export=ALL)
mkdir -p "$GRPO_CONFORM_OUT"
array=$(sbatch --parsable "$here/slurm-array.sh")
array=${array%%;*}  # --parsable prints "id" or "id;cluster"
sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes "$here/slurm-merge.sh"
