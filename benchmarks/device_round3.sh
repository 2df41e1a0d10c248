#!/usr/bin/env bash
# Device call, round 3 (device tool, one H200): one-exp Triton variants, then the validator with
# batched timing on seed workloads (honest kernels must not be flagged; cheaters still caught).
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$LOG"
python3 benchmarks/explore_triton.py --group safe3 --autograd --out "$R" 2>&1 | tee -a "$LOG"
python3 benchmarks/explore_triton.py --group forward3 --out "$R" 2>&1 | tee -a "$LOG"
explore_variants 45 split:chunk=16384,block=4096,num_warps=4,vector=1 split:chunk=16384,block=2048,num_warps=4,vector=1 \
         split:chunk=32768,block=4096,num_warps=4,vector=1 split:chunk=16384,block=4096,num_warps=8,vector=1 \
         split:chunk=16384,block=4096,num_warps=4,vector=0,hints=0
timeout -s KILL 240 python3 -m grpo_conform check implementations/triton implementations/pytorch \
  --workload seed-b2 --workload seed-b16 --no-evidence --format json > "$OUT/smoke.json" 2> "$OUT/smoke.log"
echo "check exit $?" | tee -a "$OUT/smoke.log"
timeout -s KILL 120 python3 -m grpo_conform check tests/gallery/cached-timing tests/gallery/side-stream \
  tests/gallery/unwritten-last-row --workload seed-b2 --no-evidence --format json > "$OUT/gallery.json" 2>> "$OUT/smoke.log"
echo "gallery exit $?" | tee -a "$OUT/smoke.log"
tail -3 "$OUT/smoke.log"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | grep -v "^{" | tail -70
