#!/usr/bin/env bash
# Device call, round 6 (device tool, one H200): the best staged shapes of round 5 again and their
# neighbours, loss-only kernels, and the L2 flush A/B (dirty vs clean lines left behind), all timed
# with the pre-start spin.
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$LOG"
explore_variants 60 split:chunk=16384,block=4096,num_warps=4,vector=0 \
         staged:stage_bytes=16384,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=16384,block=2048,num_warps=4,thread_stats=0 \
         staged:stage_bytes=16384,block=1024,num_warps=4,thread_stats=1 \
         staged:stage_bytes=12288,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=20480,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=16384,block=4096,num_warps=4,thread_stats=1 \
         staged:stage_bytes=32768,block=2048,num_warps=4,thread_stats=1
timeout -s KILL 120 python3 benchmarks/explore_triton.py --group forward6 --autograd --out "$R" 2>&1 | tee -a "$LOG"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | grep -v "^{" | tail -70
