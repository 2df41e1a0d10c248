"""Print a short table from what a device run left under OUT (explore.json, *.json check reports)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def explore(path: Path) -> None:
    rows = json.loads(path.read_text())
    print(f"{'variant':<70} batch   median ms   x floor   grad err   last row")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<70} {r['batch']:>5}   ERROR {r['error'][:80]}")
            continue
        err = r.get("grad_rel_err", float("nan"))
        print(f"{r['variant']:<70} {r['batch']:>5}   {r['median_ms']:9.4f}   {r['ratio']:7.3f}   {err:8.2e}   "
              f"{r.get('last_row_max', 0):.1e}")


def check(path: Path) -> None:
    report = json.loads(path.read_text())
    print(f"{path.name}: exit {report.get('exit_code')}  device {report['device'].get('name')}")
    for impl in report["implementations"]:
        print(f"  {impl['name']}: {impl['status']}: {impl['message'][:150]}")
        for w in impl["workloads"]:
            bad = [f"{c['check']}={c['status']}" for c in w["checks"] if c["status"] not in ("pass", "skipped")]
            print(f"    {w['workload']}: {', '.join(bad) or 'all pass'}")
            for t in w.get("timings", []):
                print(f"      {t['protocol']}: {t.get('summary', '')}")


def main() -> None:
    out = Path(sys.argv[1])
    if (out / "explore.json").exists():
        explore(out / "explore.json")
    for name in ("smoke.json", "gallery.json", "check.json", "check-triton.json", "bench.json"):
        p = out / name
        if p.exists() and p.stat().st_size:
            try:
                check(p) if name != "bench.json" else print(p.read_text()[:3000])
            except (json.JSONDecodeError, KeyError) as exc:
                print(f"{name}: unreadable ({exc})")


if __name__ == "__main__":
    main()
