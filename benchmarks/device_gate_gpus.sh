#!/usr/bin/env bash
# Issue 15 (one H200) and issue 17 (two H200s): `check --gpus` / `--jobs` give the verdicts of a
# serial run, and two GPUs cut the wall time. For the lead (device tool), e.g.
#   run kind=nvidia-h200-x2  command="bash benchmarks/device_gate_gpus.sh"   (carry .whl)
# On a one-GPU machine the two-GPU part is skipped. Results in $OUT: one JSON report per mode,
# gate-gpus.md (the table for the closing notes), the stderr logs.
set -uo pipefail
source benchmarks/device_common.sh
IMPLS="implementations/pytorch implementations/liger implementations/liger-inplace implementations/torch-compile implementations/triton"
SEED="--workload seed-b2 --workload seed-b4 --workload seed-b8 --workload seed-b16"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $GPUS" | tee "$OUT/gate.log"

mode() {  # NAME ARGS...: one timed check of every implementation, wall time in $OUT/NAME.wall
  local name=$1; shift
  local t0=$(date +%s.%N)
  python3 -m grpo_conform check $IMPLS --device cuda --no-evidence --format json "$@" \
      > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name exit $? wall $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s" | tee -a "$OUT/gate.log"
}

# Issue 15: on one GPU, pinned and two untimed slots agree with a serial run.
mode serial-untimed $SEED --no-timing
mode gpus0-jobs2-untimed $SEED --no-timing --gpus 0 --jobs 2
# Issue 17: timed, one GPU vs two.
mode gpus0 $SEED --gpus 0
if [ "$GPUS" -ge 2 ]; then
  mode gpus01 $SEED --gpus 0,1
fi
python3 benchmarks/summarize_gate.py "$OUT" | tee "$OUT/gate-gpus.md"
