"""`--shard I/N`: a deterministic split of the work units (implementation x member x workload)
over N machines, the same on every machine that runs the same command on the same tree.

Units are weighed by the spec's size model: traffic-v1 (grpo_conform.floors, docs/floors.md), the
bytes of every declared input read and every output and gradient written, so a float32 workload
weighs twice a bfloat16 one of the same shape, and a member with more tensors weighs more. Ranged
axes count at their midpoint (what a run draws on average). A fixed cost is added for a worker start
and the per-workload checks that do not scale with size (on CUDA a larger one, and one per member:
`CUDA_UNIT_COST`, `CUDA_MEMBER_COST`). Units are dealt heaviest first to the least loaded shard, ties
to the lowest index (greedy LPT: no shard ends more than one unit above the lightest), the same on
every machine. An implementation that runs nothing (skipped) is one pseudo-unit, so exactly one shard
reports it.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from grpo_conform.floors import FloorError, tensor_traffic
from grpo_conform.gate.selection import SelectionError
from grpo_conform.results import NotRun

# Bytes of traffic that cost as much time as a worker start and a unit's fixed checks: a CPU run
# of the smallest workloads (tens of kB) takes ~10 s, nearly all of it fixed, as does a bf16
# workload of ~2M logits (the previous element-count weighing used 2M elements: 8 MB of traffic).
UNIT_BASE_COST = 8_000_000
# On a GPU the fixed costs dominate: a least-squares fit of the H200 default check's 46 conformance
# workloads (docs/timing.md, "Fourteenth session") gave 4.8 s for a member's first workload (its kernels
# compiled, its worker's first calls), 2.35 s per workload and 1.27 s per GB of traffic-v1. In bytes at
# that rate: a workload costs 1.85 GB and a member 3.8 GB beyond their traffic. Weighed by bytes alone,
# token-is's thirteen workloads (25 GB) filled one of four slots, which ended its conformance at 78 s
# while the others, with six masked members each, ran to 109-117 s. (The default check did not end sooner
# by it: its heaviest slot holds six masked members under either weighing.)
CUDA_UNIT_COST = 1_850_000_000
CUDA_MEMBER_COST = 3_800_000_000


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise SelectionError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4 (for a Slurm array "
                             "starting at 0: --shard $((SLURM_ARRAY_TASK_ID + 1))/$SLURM_ARRAY_TASK_COUNT)")
    return int(m.group(1)), int(m.group(2))


class _Midpoint(random.Random):
    """Resolves a ranged axis to the middle of its range: the size a run draws on average."""

    def randint(self, a: int, b: int) -> int:  # type: ignore[override]
        return (a + b) // 2


def workload_bytes(spec, workload) -> int:
    """traffic-v1 bytes of one workload: what the size model says a call must move."""
    resolved = spec.resolve(workload, _Midpoint())
    try:
        return sum(t.bytes for t in tensor_traffic(spec, resolved))
    except FloorError:  # a dtype without a known byte size: weigh its elements at 4 bytes
        return 4 * sum(resolved.numel(t.name) for t in spec.inputs)


def unit_cost(plan, unit: tuple[str, str, str], device_type: str = "cpu") -> int:
    """The unit's weight in bytes of traffic: its traffic-v1 bytes and a fixed cost (UNIT_BASE_COST; on
    CUDA, CUDA_UNIT_COST and the member's CUDA_MEMBER_COST shared by its workloads)."""
    arg, member, workload = unit
    p = next(p for p in plan.implementations if p.arg == arg)
    for m in p.members:
        if m.label == member:
            w = next(w for w in m.workloads if w.name == workload)
            if device_type == "cuda":
                return CUDA_UNIT_COST + CUDA_MEMBER_COST // len(m.workloads) + workload_bytes(m.spec, w)
            return UNIT_BASE_COST + workload_bytes(m.spec, w)
    return UNIT_BASE_COST


def assign(plan, count: int, device_type: str = "cpu") -> dict[tuple[str, str, str], int]:
    """Unit -> shard index (1-based), units weighed for the run's device (`unit_cost`)."""
    units = [u for p in plan.implementations for u in p.units()]
    weighted = sorted(((unit_cost(plan, u, device_type), u) for u in units), key=lambda cu: (-cu[0], cu[1]))
    load = [0] * count
    out: dict[tuple[str, str, str], int] = {}
    for cost, u in weighted:
        k = min(range(count), key=lambda i: (load[i], i))
        load[k] += cost
        out[u] = k + 1
    return out


def shard_units(plan, shard: tuple[int, int], device_type: str = "cpu"):
    index, count = shard
    where = assign(plan, count, device_type)
    mine = {u for u, k in where.items() if k == index}
    kept = apply_units(plan, mine, "run in another shard", where=where, count=count)
    note = f"--shard {index}/{count}: {len(mine)} of {len(where)} work units"
    return replace(kept, notes=kept.notes + (note,))


def apply_units(plan, units: set, reason: str, where: dict | None = None, count: int | None = None):
    """Keep only `units`; the others become not-run workloads (kind `elsewhere` until merged)."""
    impls = []
    for p in plan.implementations:
        own = [u for u in p.units() if u in units]
        if not own:
            continue
        members = []
        for m in p.members:
            run = tuple(w for w in m.workloads if (p.arg, m.label, w.name) in units)
            away = []
            for w in m.workloads:
                if (p.arg, m.label, w.name) not in units:
                    k = where.get((p.arg, m.label, w.name)) if where else None
                    away.append(NotRun(w.name, f"{reason} ({k}/{count})" if k else reason, "elsewhere"))
            members.append(replace(m, workloads=run, not_run=m.not_run + tuple(away)))
        impls.append(replace(p, members=tuple(members)))
    return replace(plan, implementations=tuple(impls))
