"""The README's results table from evidence records: one row per (member, workload, protocol), one column
per implementation, each cell `device ms (x floor), wall ms` (median device time through the harness,
its ratio to the run's measured floor, host-inclusive wall time). Untimed records are left out.

    python3 tools/results_table.py evidence/h200 --since 20261202T113 [--until 20261202T13] [--impl triton ...]

A record's place in time is the UTC stamp in its file name; where several records time the same cell,
the last one read (file name order) wins, so bound the run with --since and --until.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from grpo_conform.evidence.dsse import json_int
from grpo_conform.evidence.records import read_envelope

PROTOCOLS = ("full", "full-scaled", "forward")


def statements(paths: list[str], since: str, until: str = ""):
    for p in paths:
        files = sorted(Path(p).glob("*.intoto.json")) if Path(p).is_dir() else [Path(p)]
        for f in files:
            stamp = f.name.split("--")[-2]
            stamp = stamp.split("-")[0]
            if stamp < since or (until and stamp >= until):
                continue
            yield f.name, json.loads(read_envelope(f).payload, parse_int=json_int)  # as `verify` reads payloads


def cell(t: dict) -> str:
    med = t["event"]["median_ns"] / 1e6
    ratio = t.get("measured_floor_ratio")
    wall = (t.get("host_wall") or {}).get("median_ns")
    text = f"{med:.3f}" + (f" ({ratio:.2f}x)" if isinstance(ratio, (int, float)) else "")
    return text + (f", {wall / 1e6:.3f}" if wall else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--since", default="", help="UTC stamp prefix, e.g. 20261202T10: records finished then or later")
    ap.add_argument("--until", default="", help="UTC stamp prefix: records finished before it (default: no bound)")
    ap.add_argument("--impl", action="append", default=[], help="column order (default: as found)")
    args = ap.parse_args()
    rows: dict[tuple, dict[str, str]] = {}
    impls: list[str] = list(args.impl)
    for _name, st in statements(args.paths, args.since, args.until):
        p = st["predicate"]
        impl, member = p["implementation"]["name"], p["spec"].get("member", "")
        for w in p["workloads"]:
            for t in w.get("timings", ()):
                if t.get("protocol") not in PROTOCOLS:
                    continue
                key = (member, w["workload"], PROTOCOLS.index(t["protocol"]), t["protocol"])
                rows.setdefault(key, {})[impl] = cell(t)
                if impl not in impls:
                    impls.append(impl)
    if not rows:
        print("no timed records found", file=sys.stderr)
        return 1
    print("| member, workload | protocol | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    def natural(item):  # seed-b2 before seed-b16
        (member, workload, k, _p), _ = item
        return member != "token-is", member, [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", workload)], k

    for (member, workload, _k, protocol), cells in sorted(rows.items(), key=natural):
        print(f"| {member}, {workload} | {protocol} | " + " | ".join(cells.get(i, "-") for i in impls) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
