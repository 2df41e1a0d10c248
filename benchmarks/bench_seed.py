"""The issue-5 benchmark: every bundled implementation on the seed workloads, forward and
forward+backward, measured side by side in one run on one GPU with grpo_conform's harness.

Two ways to get the numbers (both use grpo_conform.checks.timed, the one timing harness):
    python3 benchmarks/bench_seed.py --run            # times them now (grpo_conform.bench)
    python3 benchmarks/bench_seed.py --reports a.json b.json ...   # tables from `check --format json`
Prints median ms, ratio to the floor at this run's measured ceilings (bytes that must cross DRAM:
the logits read, plus the gradient written for full, over the measured read / copy bandwidth),
ratio to Liger (inplace=False), peak extra memory over logits + gradient, and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BUNDLED = ("triton", "liger", "liger-inplace", "torch-compile", "pytorch")
SEED = ("seed-b2", "seed-b4", "seed-b8", "seed-b16")


def rows_from_reports(paths: list[str]) -> tuple[list[dict], dict]:
    rows, meta = [], {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        meta = {k: report.get(k) for k in ("device", "hardware", "software", "started", "finished")}
        for impl in report["implementations"]:
            for w in impl["workloads"]:
                if w["workload"] not in SEED:
                    continue
                failed = [c["check"] for c in w["checks"] if c["status"] in ("fail", "error", "timeout")]
                for t in w["timings"]:
                    rows.append({"implementation": impl["name"], "workload": w["workload"], "batch": w["axes"]["batch"],
                                 "protocol": t["protocol"], "timing": t, "failed_checks": failed})
    return rows, meta


def rows_from_bench() -> tuple[list[dict], dict]:
    from grpo_conform.bench import BenchRequest, run_bench

    paths = tuple(str(ROOT / "implementations" / n) for n in BUNDLED)
    report = run_bench(BenchRequest(paths=paths, protocols=("forward", "full"), workloads=SEED), progress=print)
    rows = [{"implementation": r.implementation, "workload": r.workload, "batch": int(r.workload.split("-b")[1]),
             "protocol": r.protocol, "timing": r.timing, "failed_checks": list(r.failed_checks), "status": r.status}
            for r in report.rows]
    data = report.to_json()
    return rows, {k: data.get(k) for k in ("device", "hardware", "software", "started", "finished")}


def table(rows: list[dict], meta: dict) -> str:
    liger = {(r["workload"], r["protocol"]): r["timing"]["event"]["median_ns"] for r in rows
             if r["implementation"] == "liger" and r.get("timing")}
    sw = meta.get("software") or {}
    lines = [f"GPU {meta.get('device', {}).get('name')} driver {meta.get('device', {}).get('driver')}; "
             f"torch {sw.get('torch')} triton {sw.get('triton')} grpo-conform {sw.get('grpo_conform')} "
             f"commit {str(sw.get('git_commit'))[:12]}{' (dirty)' if sw.get('git_dirty') else ''}; {meta.get('finished')}",
             "ratios to the floor use this run's measured ceilings (read bandwidth for forward, copy for full)",
             f"{'implementation':<15}{'batch':>6} {'protocol':<8}{'median ms':>11}{'x floor':>9}{'x liger':>9}"
             f"{'peak/(L+G)':>12}  failed checks"]
    order = {n: i for i, n in enumerate(BUNDLED)}
    for r in sorted(rows, key=lambda r: (r["protocol"], r["batch"], order.get(r["implementation"], 99))):
        t = r.get("timing")
        if not t:
            lines.append(f"{r['implementation']:<15}{r['batch']:>6} {r['protocol']:<8}  {r.get('status', 'no timing')}")
            continue
        med = t["event"]["median_ns"]
        ref = liger.get((r["workload"], r["protocol"]))
        floor = t.get("measured_floor_ratio")
        logits = t["floor"]["traffic"][0]["bytes"]
        peak = (logits + t["peak_bytes"]) / (2 * logits) if r["protocol"] == "full" else None
        lines.append(f"{r['implementation']:<15}{r['batch']:>6} {r['protocol']:<8}{med / 1e6:>11.4f}"
                     f"{(f'{floor:.2f}' if isinstance(floor, float) else ''):>9}"
                     f"{(f'{ref / med:.2f}' if ref else ''):>9}{(f'{peak:.3f}' if peak else ''):>12}  "
                     f"{', '.join(r['failed_checks'])}")
    lines.append("x liger > 1 means faster than Liger; peak/(L+G): (logits + peak memory the call allocated) / "
                 "(logits + gradient)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--reports", nargs="*")
    ap.add_argument("--json", help="write rows and provenance here")
    args = ap.parse_args()
    rows, meta = rows_from_bench() if args.run else rows_from_reports(args.reports or [])
    print(table(rows, meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
