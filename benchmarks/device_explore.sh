#!/usr/bin/env bash
# Device call 1 (device tool, one H200): explore Triton launch settings, then smoke-test the
# validator on CUDA (IPC, allocator poison, timing harness, floors) with every bundled
# implementation and the CUDA-only gallery. Full results under $OUT; a short table last.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/explore.log
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
R=$OUT/explore.json
python3 benchmarks/explore_triton.py --group safe --out "$R" 2>&1 | tee -a "$LOG"
python3 benchmarks/explore_triton.py --group forward --out "$R" 2>&1 | tee -a "$LOG"
for v in sync:16384:16 sync:8192:8 sync:32768:16 sync:16384:8 sync:8192:16 sync:32768:32 sync:16384:16:plain; do
  timeout -s KILL 45 python3 benchmarks/explore_triton.py --variant "$v" --out "$R" 2>&1 | tee -a "$LOG" \
    || echo "variant $v ended with status $?" | tee -a "$LOG"
done
SMOKE=$OUT/smoke.log
timeout -s KILL 330 python3 -m grpo_conform check implementations/pytorch implementations/triton implementations/liger \
  implementations/liger-inplace implementations/torch-compile --workload small-bf16 --workload odd-vocab \
  --workload seed-b2 --evidence-dir "$OUT/ev" --format json > "$OUT/smoke.json" 2> "$SMOKE"; echo "check exit $?" | tee -a "$SMOKE"
timeout -s KILL 150 python3 -m grpo_conform check tests/gallery/side-stream tests/gallery/cached-timing \
  tests/gallery/correct-then-lazy tests/gallery/unwritten-last-row tests/gallery/inplace-gradient \
  --workload seed-b2 --no-evidence --format json > "$OUT/gallery.json" 2>> "$SMOKE"; echo "gallery exit $?" | tee -a "$SMOKE"
tar czf "$OUT/ev.tgz" -C "$OUT" ev 2>/dev/null && rm -rf "$OUT/ev"
python3 benchmarks/summarize_device.py "$OUT" 2>&1 | tail -60
