"""Judging an operation whose gradients are compared unit by unit with an error model of its own
(grpo-fused-linear: `Operation.error_model`, the lm_head GEMM's rounding): every gradient the spec
lists, by name, against the reference's chunks of it. Shared by the conformance run and the timed
re-checks; grpo-logits keeps its own path (its fp32 floors, row sums and last position)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from grpo_conform.compare import GradientComparator, GradientComparisons, LossComparison, compare_loss
from grpo_conform.ops.interface import GradientGrouping


def judge_units(op: Any, spec: Any, rw: Any, tol: Any, params: Any, x: Mapping[str, torch.Tensor],
                loss: float, grads: Mapping[str, torch.Tensor], c: float, model: Any,
                groupings: Mapping[str, GradientGrouping], subnormal: float,
                ref_loss: float) -> tuple[LossComparison, GradientComparisons]:
    """(loss comparison, each gradient's comparison): the spec's tolerance per element plus `model`'s
    allowance of each unit (`model.allowance(name, start, stop, unit scale)`, element and Frobenius
    alike), both scaled by |c| as the reference is by the upstream scalar c, plus `model.underflow` (not
    scaled: a flush threshold is the dtype's); the element floor is `subnormal`; both floors times max(1, |c|)
    where `model.formed_before_upstream` (a gradient formed at upstream 1, then scaled); the loss allowance adds
    `model.loss`."""
    comparisons = {}
    # gradients formed before the upstream scalar is known keep the absolute floors of upstream 1, scaled with it
    k = max(1.0, abs(c)) if getattr(model, "formed_before_upstream", False) else 1.0
    for name, chunks in op.reference_gradients(spec, x, params).items():
        if name not in grads:  # a call with frozen inputs (`only`) returns and is judged on the others
            continue
        width = groupings[name].width(rw)
        cmp = GradientComparator(tol.gradient, None, width, row_sums=False)
        flat = grads[name].reshape(-1, width)
        for ch in chunks:
            scale = ch.scale * abs(c)
            # what a GEMM flushing subnormal terms may lose (model.underflow) is part of the model's allowance,
            # in the Frobenius norm too: where every term of a unit is below the flush threshold (a float16
            # reach call with a wide last axis), all of them may go, and an honest float16 path's gradient was
            # 95% off in norm with every element inside its floor (docs/checks.md, twenty-eighth session)
            extra = model.allowance(name, ch.start, ch.stop, ch.scale) * abs(c) + model.underflow.get(name, 0.0) * k
            floor = torch.full_like(scale, subnormal * k)  # below the dtype's range (at upstream 1 where k > 1)
            cmp.update(ch.start, flat[ch.start : ch.stop], ch.values.reshape(-1, width) * c, scale, floor, model=extra)
        comparisons[name] = cmp
    # the reference may hand its gradients in the order it computes them cheapest (grpo-fused-linear:
    # weight first, one pass for all three); the comparisons keep the spec's order
    comparisons = {n: comparisons[n] for n in groupings if n in comparisons}
    return compare_loss(loss, ref_loss, tol.loss, model.loss), GradientComparisons(comparisons)
