"""Where one workload's GPU memory goes in the validator's own process (issue 35: a batch-8 workload reserved
32 GiB there, 16 sets, thirty-third session). Runs one member at one workload in this process (`--jobs 1`, no
timing) under the workload's gate grant, with torch's allocator history on, then replays the history and prints
the allocations alive at the peak, grouped by the innermost grpo_conform frame that made them.

    python3 benchmarks/research/memory_snapshot.py --member token-offpolicy-mask --workload mask-b8 [--out DIR]
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

import grpo_conform
from grpo_conform import device_memory

GIB = 2**30


def where(frames) -> str:
    for f in frames:
        name = f.get("filename", "")
        if "grpo_conform" in name and "memory_snapshot" not in name:
            return f"{name.split('grpo_conform/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return "(no grpo_conform frame)"


def at_peak(trace):
    live, total, peak, peak_at = {}, 0, 0, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, peak_at = total, i
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    live, total = {}, 0
    for e in trace[: peak_at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    return peak, live


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--member", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--grant-gib", type=float, default=37.3, help="the gate's grant to size by (37.3: a batch-8 workload)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    with device_memory.granted(int(a.grant_gib * GIB)):
        report = grpo_conform.check("implementations/triton", device="cuda", members=[a.member],
                                    workloads=[a.workload], timing=False, jobs=1)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"exit {report.exit_code}; reserved peak {torch.cuda.max_memory_reserved() / GIB:.2f} GiB, "
          f"allocated peak {torch.cuda.max_memory_allocated() / GIB:.2f} GiB")
    trace = snap["device_traces"][0]
    peak, live = at_peak(trace)
    groups = defaultdict(lambda: [0, 0])
    for e in live.values():
        g = groups[where(e.get("frames", []))]
        g[0] += e["size"]
        g[1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    print(f"{len(trace)} events; live at the allocated peak: {peak / GIB:.2f} GiB in {len(live)} blocks")
    for k, (size, n) in rows[:25]:
        print(f"  {size / GIB:7.2f} GiB {n:5d}  {k}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"snapshot-{a.member}-{a.workload}.json").write_text(json.dumps(
            {"peak_bytes": peak, "groups": [[k, s, n] for k, (s, n) in rows]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
