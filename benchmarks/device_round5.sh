#!/usr/bin/env bash
# Device call, round 5 (device tool, one H200): staged kernel shapes and per-thread statistics,
# staged and plain loss-only kernels, torch's own read of the same bytes.
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$LOG"
explore_variants 60 staged:stage_bytes=32768,block=2048,num_warps=4,thread_stats=0 \
         staged:stage_bytes=32768,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=16384,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=16384,block=1024,num_warps=2,thread_stats=1 \
         staged:stage_bytes=24576,block=2048,num_warps=4,thread_stats=1 \
         staged:stage_bytes=32768,block=4096,num_warps=8,thread_stats=1 \
         staged:stage_bytes=16384,block=4096,num_warps=8,thread_stats=1 \
         staged:stage_bytes=8192,block=1024,num_warps=2,thread_stats=1
timeout -s KILL 120 python3 benchmarks/explore_triton.py --group forward5 --autograd --out "$R" 2>&1 | tee -a "$LOG"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | grep -v "^{" | tail -70
