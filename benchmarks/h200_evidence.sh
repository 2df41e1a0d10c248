#!/usr/bin/env bash
# The evidence run (device tool, one H200): `grpo-conform check` of every bundled implementation on
# the spec's CUDA workloads (seed workloads timed), one process per implementation so that a
# timeout loses only that one, records unsigned (signed afterwards, off this machine, with
# `grpo-conform sign`), then the issue-5 table from the same reports.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/h200" "$OUT/reports"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/reports/nvidia-smi.txt"
for item in ${@:-triton:150 liger-inplace:90 liger:110 pytorch:110 torch-compile:120}; do
  name=${item%%:*}; limit=${item##*:}
  timeout -s KILL "$limit" python3 -m grpo_conform check "implementations/$name" --evidence-dir "$OUT/h200" \
    --format json > "$OUT/reports/$name.json" 2> "$OUT/reports/$name.log"
  echo "$name: exit $?" | tee -a "$OUT/reports/status.txt"
done
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
