#!/usr/bin/env bash
# Device call, round 4 (device tool, one H200): the shared-memory staged kernel (Gluon) against the
# shipped split kernel, forward program counts, then the validator's CUDA-only items of issue 4
# (bench CLI, side-stream / caching / lazy gallery) under the adaptive pre-start spin.
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$LOG"
explore_variants 60 split:chunk=16384,block=4096,num_warps=4,vector=0 \
         staged:stage_bytes=65536,block=2048,num_warps=4 staged:stage_bytes=65536,block=2048,num_warps=8 \
         staged:stage_bytes=65536,block=4096,num_warps=8 staged:stage_bytes=32768,block=2048,num_warps=4 \
         staged:stage_bytes=86016,block=2048,num_warps=8 staged:stage_bytes=131072,block=4096,num_warps=8
timeout -s KILL 90 python3 benchmarks/explore_triton.py --group forward4 --autograd --out "$R" 2>&1 | tee -a "$LOG"
G=$OUT/gallery.log
timeout -s KILL 100 python3 -m grpo_conform check implementations/triton --workload seed-b2 --workload seed-b16 \
  --no-evidence --format json > "$OUT/check-triton.json" 2> "$G"; echo "check triton exit $?" | tee -a "$G"
timeout -s KILL 100 python3 -m grpo_conform bench implementations/pytorch > "$OUT/bench-pytorch.txt" 2>> "$G"
echo "bench pytorch exit $?" | tee -a "$G"; cat "$OUT/bench-pytorch.txt"
timeout -s KILL 120 python3 -m grpo_conform check tests/gallery/side-stream tests/gallery/cached-timing \
  tests/gallery/correct-then-lazy --workload seed-b2 --no-evidence > "$OUT/gallery.txt" 2>> "$G"
echo "gallery exit $?" | tee -a "$G"; cat "$OUT/gallery.txt"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | grep -v "^{" | tail -60
