#!/usr/bin/env bash
# Device call, round 8 (device tool, one H200, ~4 minutes): the CUDA tests of the Triton kernels
# (staged member kernels, the gradient-mode choice), then benchmarks/kernel_v3.py (seed batches
# 2/4/8/16 at c = 1 and 0.25, forward, the launch-bound shape, masked members at batch 8, backward
# tunings; Liger beside ours when a liger-kernel wheel is carried), the issue-14 targets last.
#   run: bash benchmarks/device_kernel_v3.sh          (carry .whl/ as for the other device scripts)
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/nvidia-smi.txt"
timeout -s KILL 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_cuda.py > "$OUT/cuda-tests.txt" 2>&1
echo "cuda tests: exit $?"; tail -5 "$OUT/cuda-tests.txt"
timeout -s KILL 330 python3 benchmarks/kernel_v3.py ${KERNEL_V3_ARGS:-} 2>&1 | tee "$OUT/kernel_v3.log" | grep -v '^{'
echo "kernel_v3: exit ${PIPESTATUS[0]}"
