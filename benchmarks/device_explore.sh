#!/usr/bin/env bash
# Device call (device tool, one H200): explore Triton launch settings, then smoke-test the
# validator on CUDA (IPC, allocator poison, timing harness, floors) with every bundled
# implementation and the CUDA-only gallery. Full results under $OUT; a short table last.
set -u
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG"
python3 benchmarks/explore_triton.py --group safe --autograd --out "$R" 2>&1 | tee -a "$LOG"
python3 benchmarks/explore_triton.py --group forward --out "$R" 2>&1 | tee -a "$LOG"
explore_variants 45 split:chunk=16384,block=4096,num_warps=4 split:chunk=16384,block=8192,num_warps=8 \
         split:chunk=32768,block=8192,num_warps=8 split:chunk=8192,block=8192,num_warps=8 \
         split:chunk=32768,block=4096,num_warps=4,num_stages=2 sync:chunk=32768,num_warps=32
SMOKE=$OUT/smoke.log
timeout -s KILL 300 python3 -m grpo_conform check implementations/pytorch implementations/triton implementations/liger \
  implementations/liger-inplace implementations/torch-compile --workload small-bf16 --workload odd-vocab \
  --workload seed-b2 --evidence-dir "$OUT/ev" --format json > "$OUT/smoke.json" 2> "$SMOKE"; echo "check exit $?" | tee -a "$SMOKE"
timeout -s KILL 150 python3 -m grpo_conform check tests/gallery/side-stream tests/gallery/cached-timing \
  tests/gallery/correct-then-lazy tests/gallery/unwritten-last-row tests/gallery/inplace-gradient \
  --workload seed-b2 --no-evidence --format json > "$OUT/gallery.json" 2>> "$SMOKE"; echo "gallery exit $?" | tee -a "$SMOKE"
tar czf "$OUT/ev.tgz" -C "$OUT" ev 2>/dev/null && rm -rf "$OUT/ev"
tail -5 "$SMOKE"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | tail -90
