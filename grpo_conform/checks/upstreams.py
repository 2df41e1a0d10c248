"""Upstream scalars a probe backpropagates, drawn by the parent (the `upstream` probe and the reach calls)."""

from __future__ import annotations

from typing import Any


def draw_upstream(run: Any, kind: str, record: bool = True) -> float:
    """A parent-drawn upstream scalar: negative, tiny, large or a fraction 1/k (what gradient accumulation,
    loss scaling and loss weights do). Tiny stays above float16's subnormal range at seed scales. `record`:
    kept in the workload's draws under its kind (the reach calls keep theirs with each call)."""
    r = run.rng
    fp16 = run.grad_dtype == "float16"
    if kind == "negative":
        c = -r.uniform(0.25, 4.0)
    elif kind == "tiny":
        c = r.uniform(1e-2, 5e-2) if fp16 else 10 ** r.uniform(-4.0, -3.0)
    elif kind == "fraction":  # 1/k of gradient accumulation: (0.05, 1) was never drawn (round of 2026-12-05)
        c = 1.0 / r.choice((2, 3, 4, 8, 16, 32, 64))
    else:
        c = r.uniform(64.0, 512.0) if fp16 else 2 ** r.uniform(6.0, 12.0)
    c = float(f"{c:.6g}")
    if record:
        run.draws.setdefault("upstream", {})[kind] = c
    return c
