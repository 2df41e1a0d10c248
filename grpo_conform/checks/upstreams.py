"""Upstream scalars a probe backpropagates, drawn by the parent (the `upstream` probe and the reach calls)."""

from __future__ import annotations

import math
from typing import Any

from grpo_conform.phases import PHASES

FP16_LOSS_SCALE = 2.0 ** 16  # torch.amp.GradScaler's initial scale
RANGE_MARGIN = 16  # a scaled reference gradient may use 1/16 of its dtype's finite range (the upstream probe, reach)
FP16_HEADROOM = 65504.0 / RANGE_MARGIN  # the largest scaled gradient element a loss scale may make in float16


def draw_upstream(run: Any, kind: str, record: bool = True, bound: float | None = None) -> float:
    """A parent-drawn upstream scalar: negative, tiny, large or a fraction 1/k (what gradient accumulation,
    loss scaling and loss weights do). Tiny stays above float16's subnormal range at seed scales. Large in
    float16 with `bound` (the largest |element| of the reference gradient, `gradient_bound`) is a loss scale:
    the largest power of two up to 2^16 that keeps every scaled element within FP16_HEADROOM, so a gradient
    rounded to float16 before the scale multiplies it (its small elements on the subnormal grid or 0) shows.
    `record`: kept in the workload's draws under its kind (the reach calls keep theirs with each call)."""
    r = run.rng
    fp16 = run.grad_dtype == "float16"
    if kind == "negative":
        c = -r.uniform(0.25, 4.0)
    elif kind == "tiny":
        c = r.uniform(1e-2, 5e-2) if fp16 else 10 ** r.uniform(-4.0, -3.0)
    elif kind == "fraction":  # 1/k of gradient accumulation: (0.05, 1) was never drawn (round of 2026-12-05)
        c = 1.0 / r.choice((2, 3, 4, 8, 16, 32, 64))
    elif fp16 and bound is not None:
        room = FP16_HEADROOM / bound if bound > 0 else FP16_LOSS_SCALE
        c = 2.0 ** max(0, min(16, math.floor(math.log2(min(room, FP16_LOSS_SCALE)))))
    else:
        c = r.uniform(64.0, 512.0) if fp16 else 2 ** r.uniform(6.0, 12.0)
    c = float(f"{c:.6g}")
    if record:
        run.draws.setdefault("upstream", {})[kind] = c
    return c


def gradient_bound(run: Any, slot: Any) -> float:
    """The largest |element| of the float64 reference gradients of `slot`'s pristine inputs."""
    with PHASES("reference"):
        grads = run.op.reference_gradients(run.spec, slot.pristine, run.model.params)
        return max((float(chunk.values.abs().max()) for chunks in grads.values() for chunk in chunks
                    if chunk.values.numel()), default=0.0)


def room(bound: float, top: float) -> float:
    """The largest |upstream scalar| that keeps a reference gradient of largest |element| `bound` within
    1/RANGE_MARGIN of `top` (its dtype's largest finite value); inf for an all-zero gradient."""
    return top / RANGE_MARGIN / bound if bound > 0 else math.inf
