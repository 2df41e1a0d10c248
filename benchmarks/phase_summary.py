"""Summarise a `check --profile-phases --format json` report: member verdicts, seconds per member,
the validator's own GPU memory after each workload (the leak round30a found), storages the worker kept, and
where slots shared the GPU each grant size against what its workloads reserved (docs/timing.md, "Thirty-third
session").

    python3 benchmarks/phase_summary.py report.json[.gz]
"""
import gzip
import json
import sys
from collections import defaultdict


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def main(path: str) -> None:
    report = load(path)
    phases = report.get("phases", {})
    per_member: dict[str, float] = defaultdict(float)
    for key, seconds in phases.get("workloads_s", {}).items():
        member = key.split(" ")[1]  # "impl member workload", or "... (alone)" for a run again alone
        per_member[member] += seconds
    for impl in report["implementations"]:
        statuses = [m["status"] for m in impl["members"]]
        print(impl["name"], impl["status"], {s: statuses.count(s) for s in sorted(set(statuses))})
        for m in impl["members"]:
            name = m["spec"].get("member")
            print(f"  {name:34s} {m['status']:11s} {per_member.get(name, 0.0):6.1f} s")
            for w in m.get("workloads", []):
                draws = w.get("draws") or {}
                held = draws.get("held_after_unbind", []) + draws.get("held_after_unbind_timed", [])
                if draws.get("cuda_allocated_after", 0) > 1 << 30 or held:
                    print("    memory", w.get("workload"), draws.get("cuda_allocated_after"), held[:4])
    print("wall_s", phases.get("wall_s"), "counts", phases.get("counts"))
    print("probes_s", {k: round(v, 1) for k, v in list(phases.get("probes_s", {}).items())[:10]})
    grants(report)
    pairs = phases.get("probe_workloads_s") or {}  # since 2b7aab7: each probe's seconds per workload
    if pairs:
        top = sorted(pairs.items(), key=lambda kv: -kv[1])[:8]
        print("largest probe @ workload", {k: round(v, 1) for k, v in top})


def grants(report: dict) -> None:
    """Per grant size: the workloads, their waits, and the most the slot and the worker reserved (GiB)."""
    by_size: dict[float, list] = defaultdict(list)
    for impl in report["implementations"]:
        for m in impl["members"]:
            for w in m.get("workloads", []):
                g = (w.get("draws") or {}).get("gpu_grant")
                if g:
                    peak = g.get("peak") or {}
                    slot, worker = peak.get("slot") or 0, peak.get("worker") or 0
                    by_size[round(g["bytes"] / 2**30, 1)].append((g["waited_s"], slot / 2**30, worker / 2**30))
    for size, rows in sorted(by_size.items()):
        both = sorted(s + w for _, s, w in rows)
        print(f"grant {size:6.1f} GiB: {len(rows):3d} workloads, waited {sum(r[0] for r in rows):6.1f} s; reserved max "
              f"slot {max(r[1] for r in rows):5.1f} worker {max(r[2] for r in rows):5.1f} both {both[-1]:5.1f} "
              f"(median {both[len(both) // 2]:5.1f})")


if __name__ == "__main__":
    main(sys.argv[1])
