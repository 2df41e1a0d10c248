"""The member's boundaries (knots) and keeping drawn values clear of them.

A knot is a value where the gradient jumps: the clip bounds 1 - epsilon_low and 1 + epsilon_high (CISPO's cap
epsilon_high instead), the two-sided clip delta, and in vLLM's mask modes the sampling-ratio cap. A float32
kernel and the float64 reference may put a ratio within float32's resolution of a knot on different sides, so the
drawn sets keep every live ratio `boundary_margin` (relative) from every knot; exact ties are the `exact-ties`
probe's business.

`clear_of_knots` restores that after a probe moves drawn values: the mask-runs probe shifts every token's
log-ratio by +-0.5 to 1.5 (ops/grpo_mask_runs.py), which put a ratio 6e-6 from 1 + epsilon_high, at a token whose
log-prob was -414 where float32 resolves 3e-5: an honest float32 kernel kept the token that the reference
clipped (CI, forty-first session; 1 set in 300 of token-offpolicy-mask-delta).
"""

from __future__ import annotations

import math

import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters

CLEAR = 1.5  # a moved value lands this many margins from the knot: past the margin, whatever float32 rounds


def ratio_knots(p: GrpoParameters) -> list[float]:
    """The policy ratio's knots, ascending and positive."""
    knots = {p.epsilon_high} if p.loss_type == "cispo" else {1.0 - p.epsilon_low, 1.0 + p.epsilon_high}
    if p.delta is not None and p.loss_type != "cispo":
        knots.add(p.delta)
    return sorted(k for k in knots if k > 0)


def _windows(knots: list[float], margin: float) -> list[tuple[float, float]]:
    """Merged log-space windows of `margin` (relative) around the knots, ascending."""
    out: list[tuple[float, float]] = []
    for k in knots:
        lo, hi = math.log(k) - math.log1p(margin), math.log(k) + math.log1p(margin)
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def raise_out(log_values: torch.Tensor, knots: list[float], margin: float) -> torch.Tensor:
    """`log_values` with each one inside a knot's window (`margin` relative) raised to CLEAR x margin above the
    knot (above the merged window's top): raising keeps an old log-prob below 0, lowering might not."""
    out = log_values
    for lo, hi in _windows(knots, margin):
        top = hi + math.log1p(margin) * (CLEAR - 1.0)
        out = torch.where((out > lo) & (out < top), torch.full_like(out, top), out)
    return out


def clear_of_knots(x: dict[str, torch.Tensor], p: GrpoParameters, margin: float, logp: torch.Tensor,
                   keep: torch.Tensor) -> list[str]:
    """Move `x`'s old log-probs and sampling ratios (in place) so that every live ratio the member judges against
    a knot keeps `margin` from it: token ratios at token level, each sequence's mean log-ratio at sequence level
    (the row's old log-probs lowered alike), token sampling ratios in token_mask mode. vLLM's sequence modes
    compare a row's product of sampling ratios, which the moves keep (mask-runs preserves every row's sum).
    `logp`: the float64 log-probs [B, S] the reference computes. The names it moved."""
    moved = []
    keep = keep.to(torch.bool).cpu()
    if "old_logprobs" in x:
        old = x["old_logprobs"]
        log_r = logp.to("cpu", torch.float64) - old.to("cpu", torch.float64)
        knots = ratio_knots(p)
        if p.importance_sampling_level == "sequence":
            n = keep.sum(-1).clamp_min(1).to(torch.float64)
            mean = torch.where(keep, log_r, torch.zeros_like(log_r)).sum(-1) / n
            lift = raise_out(mean, knots, margin) - mean
            new = log_r + torch.where(keep, lift[:, None], torch.zeros_like(log_r))
        else:
            new = torch.where(keep, raise_out(log_r, knots, margin), log_r)
        if not torch.equal(new, log_r):  # only the moved positions are written: the rest keep their bits
            moved_to = torch.where(new != log_r, logp.to("cpu", torch.float64) - new, old.to("cpu", torch.float64))
            old.copy_(moved_to.to(old.device, old.dtype))
            moved.append("old_logprobs")
    if "sampling_ratio" in x and p.sampling_ratio_cap is not None and p.vllm_importance_sampling_mode == "token_mask":
        rho = x["sampling_ratio"]
        log_rho = torch.log(rho.to("cpu", torch.float64))
        new = torch.where(keep, raise_out(log_rho, [p.sampling_ratio_cap], margin), log_rho)
        if not torch.equal(new, log_rho):
            rho.copy_(torch.where(new != log_rho, torch.exp(new), rho.to("cpu", torch.float64)).to(rho.device, rho.dtype))
            moved.append("sampling_ratio")
    return moved
