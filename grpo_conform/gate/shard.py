"""`--shard I/N`: a deterministic split of the work units (implementation x member x workload)
over N machines, the same on every machine that runs the same command on the same tree.

Units are weighed by their logits' element count (plus a fixed cost for a worker start) and dealt
largest first to the least loaded shard, ties to the lowest index: balanced and reproducible.
An implementation that runs nothing (skipped) is one pseudo-unit, so exactly one shard reports it.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from grpo_conform.results import NotRun

UNIT_BASE_COST = 2_000_000  # elements: what a worker start and a small workload cost, roughly


def parse_shard(text: str) -> tuple[int, int]:
    from grpo_conform.gate.plan import SelectionError

    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise SelectionError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4 (for a Slurm array "
                             "starting at 0: --shard $((SLURM_ARRAY_TASK_ID + 1))/$SLURM_ARRAY_TASK_COUNT)")
    return int(m.group(1)), int(m.group(2))


def unit_cost(plan, unit: tuple[str, str, str]) -> int:
    arg, member, workload = unit
    p = next(p for p in plan.implementations if p.arg == arg)
    for m in p.members:
        if m.label == member:
            w = next(w for w in m.workloads if w.name == workload)
            return UNIT_BASE_COST + m.spec.resolve(w, random.Random(0)).numel("logits")
    return UNIT_BASE_COST


def assign(plan, count: int) -> dict[tuple[str, str, str], int]:
    """Unit -> shard index (1-based)."""
    units = [u for p in plan.implementations for u in p.units()]
    weighted = sorted(((unit_cost(plan, u), u) for u in units), key=lambda cu: (-cu[0], cu[1]))
    load = [0] * count
    out: dict[tuple[str, str, str], int] = {}
    for cost, u in weighted:
        k = min(range(count), key=lambda i: (load[i], i))
        load[k] += cost
        out[u] = k + 1
    return out


def shard_units(plan, shard: tuple[int, int]):
    index, count = shard
    where = assign(plan, count)
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
