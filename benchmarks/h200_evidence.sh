#!/usr/bin/env bash
# The evidence run (device tool, one H200): `grpo-conform check` of every bundled implementation on
# the spec's CUDA workloads (seed workloads timed), one process per implementation so that a
# timeout loses only that one, records unsigned (signed afterwards, off this machine, with
# `grpo-conform sign`), then the issue-5 table from the same reports.
set -u
. benchmarks/device_common.sh
mkdir -p "$OUT/h200" "$OUT/reports"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/reports/nvidia-smi.txt"
# The GPU-only kernel paths against the float64 reference first (skipped in CI: no GPU there).
timeout -s KILL 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_cuda.py > "$OUT/reports/cuda-tests.txt" 2>&1
echo "cuda tests: exit $?" | tee -a "$OUT/reports/status.txt"; tail -3 "$OUT/reports/cuda-tests.txt"
for item in ${@:-triton:150 liger-inplace:90 liger:110 pytorch:110 torch-compile:120}; do
  name=${item%%:*}; limit=${item##*:}
  timeout -s KILL "$limit" python3 -m grpo_conform check "implementations/$name" --evidence-dir "$OUT/h200" \
    --format json > "$OUT/reports/$name.json" 2> "$OUT/reports/$name.log"
  echo "$name: exit $?" | tee -a "$OUT/reports/status.txt"
done
# Issue 4's CUDA-only items with the final harness: the bench command, the cheaters only a GPU can show.
if [ -z "${SKIP_EXTRAS:-}" ]; then
  timeout -s KILL 100 python3 -m grpo_conform bench implementations/pytorch > "$OUT/reports/bench-pytorch.txt" 2>&1
  echo "bench pytorch: exit $?" | tee -a "$OUT/reports/status.txt"
  timeout -s KILL 120 python3 -m grpo_conform check tests/gallery/side-stream tests/gallery/cached-timing \
    tests/gallery/correct-then-lazy --workload seed-b2 --no-evidence > "$OUT/reports/gallery-cuda.txt" 2>&1
  echo "gallery (must fail): exit $?" | tee -a "$OUT/reports/status.txt"
fi
python3 benchmarks/bench_seed.py --reports "$OUT"/reports/*.json --json "$OUT/reports/bench-seed.json" \
  > "$OUT/reports/bench-seed.txt" 2>&1
tar czf "$OUT/h200.tgz" -C "$OUT" h200 reports && rm -rf "$OUT/h200" "$OUT/reports"
python3 - "$OUT/h200.tgz" <<'PY'
import sys, tarfile, json
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        if m.name.endswith(("status.txt", "bench-seed.txt")):
            print(t.extractfile(m).read().decode())
        elif m.name.startswith("reports/") and m.name.endswith(".json") and "bench" not in m.name:
            try:
                r = json.load(t.extractfile(m))
            except Exception as e:
                print(m.name, "unreadable", e); continue
            for i in r["implementations"]:
                bad = sorted({f"{w['workload']}:{c['check']}" for w in i["workloads"] for c in w["checks"]
                              if c["status"] in ("fail", "error", "timeout")})
                print(i["name"], i["status"], bad[:12])
PY
