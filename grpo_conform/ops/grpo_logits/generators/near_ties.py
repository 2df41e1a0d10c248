"""Ratios a hair from the clip bounds (the `near-ties` probe's calls on the logits operation; the fused operation's
are `ops/fused_linear/near_ties.py`, which shares the placement below).

The drawn ratios keep `boundary_margin` (2%) from every bound so that a float32 kernel and the float64
reference pick the same branch on every token. That margin also hides a kernel that picks the branch from a
ratio rounded to a narrower dtype: in bfloat16 the ratio near 1.2 moves by up to 0.33%, so a token just under
1 + epsilon_high counts as clipped and gets a zero gradient (red-team round of 2026-12-06,
`ratio-saved-in-logits-dtype`). Real ratios sit densely there: most of a PPO step's tokens are near 1.

Here every live token's ratio is its bound times (1 + d), d signed, |d| log-uniform in
[NEAR_MIN, NEAR_MAX]: about a third of the tokens fall inside bfloat16's rounding band on the side that
flips, and a float16 band too. A float32 kernel computes the ratio to ~1e-7 (the rows are `tie_rows`:
logp = fp32(-log 2) exactly, and logp - old is exact), 100 times closer than NEAR_MIN, so honest kernels
pick the reference's branch on every token. The bound follows the row's advantage (1 + epsilon_high where
A > 0, 1 - epsilon_low where A < 0), the only one that decides the branch there.

Hostile angle: a kernel cannot tell these calls from drawn ones by the ratios without computing them in a
precision that already gets the branch right; the rows are `exact-ties`' own (p = 1/2 at the target).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from grpo_conform.ops.grpo_logits.member_inputs import TIE_ADVANTAGE, tie_ref_logprobs, tie_rows
from grpo_conform.ops.grpo_logits.reference import reference_logprobs
from grpo_conform.ops.grpo_terms import GrpoParameters
from grpo_conform.spec import Spec

NEAR_MIN = 1e-5  # 100x a float32 kernel's ratio error on these rows
NEAR_MAX = 4e-3  # past bfloat16's half step at 1.2 (3.3e-3)
HARD_CLIP = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # loss types whose branch is min(r A, clamp(r) A)
_SALT = 0x6E656172


def near_tie_reason(p: GrpoParameters, names: set[str]) -> str | None:
    """Why T-near does not apply (None where it does): it needs old log-probs and a hard clip."""
    if "old_logprobs" not in names:
        return "no old log-probs: the ratio is exactly 1"
    if p.loss_type.replace("-", "_") not in HARD_CLIP:
        return f"loss_type {p.loss_type!r} has no hard clip branch"
    if not 0.0 <= p.epsilon_low < 1.0 or p.epsilon_high < 0.0:
        return "the drawn epsilons leave no bound to sit beside"
    return None


def _live(x: Mapping[str, torch.Tensor], shape) -> torch.Tensor:
    return (x["completion_mask"].detach().cpu() != 0) if "completion_mask" in x else torch.ones(shape, dtype=torch.bool)


def _bounds(advantages: torch.Tensor, p: GrpoParameters, shape) -> torch.Tensor:
    """[B, S] float64: the bound each sequence's advantage decides by (1 + epsilon_high for A > 0, else 1 - epsilon_low)."""
    adv = advantages.detach().to("cpu", torch.float64).reshape(shape[0], 1).expand(*shape)
    return torch.where(adv < 0, torch.full_like(adv, 1.0 - p.epsilon_low), torch.full_like(adv, 1.0 + p.epsilon_high))


def sequence_floor(floor: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """A sequence ratio's allowance from its tokens' (`floor` [B, S]): their mean over the live tokens, expanded."""
    m = live.to(floor.dtype)
    return ((floor * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)).expand_as(floor)


def mix_signs(x: dict[str, torch.Tensor], seed: int) -> None:
    """Both bounds met, in place: rows with under half their tokens live made fully live; then the advantages
    rewritten so that the live sequences hold both signs (the
    largest |A| negated where they share one), and a call with one live sequence takes the sign of the seed's
    parity (the probe's calls alternate it). A clip specialised at one bound only (equal epsilons as one EPS with
    1 / (1 + EPS) below) shows only where a ratio sits beside that bound with an advantage of its side."""
    if "completion_mask" in x:  # a row of few live tokens holds few near ties: such rows become fully live
        m = x["completion_mask"]
        sparse = ((m != 0).sum(-1) * 2 < m.shape[-1]).to(m.device)
        m[sparse] = 1
    adv = x["advantages"]
    # a zero advantage (every set's from batch 4) has no tie to show: it takes TIE_ADVANTAGE, so a call of few
    # sequences keeps them all live (GSPO's near ties are one per sequence; the zero-advantage calls hold zeros)
    adv.masked_fill_(adv == 0, TIE_ADVANTAGE)
    a = adv.detach().to("cpu", torch.float64).reshape(-1)
    live = (_live(x, x["completion_ids"].shape).any(-1) & (a != 0)).reshape(-1)
    n = int(live.sum())
    if n == 1:
        b = int(torch.nonzero(live)[0])
        if (a[b] > 0) == bool(seed & 1):
            adv[b] = -adv[b]
    elif n >= 2 and not ((a[live] > 0).any() and (a[live] < 0).any()):
        b = int(torch.argmax(torch.where(live, a.abs(), torch.full_like(a, -1.0))))
        adv[b] = -adv[b]


def near_old_logprobs(logp: torch.Tensor, advantages: torch.Tensor, p: GrpoParameters, gen: torch.Generator,
                      floor: torch.Tensor | None = None) -> torch.Tensor:
    """float64 old log-probs [B, S] that put every token's ratio exp(logp - old) at its bound times (1 + d):
    the bound its sequence's advantage decides by, d signed, |d| log-uniform in [lo, NEAR_MAX]. lo is NEAR_MIN,
    or per token `floor` [B, S] (at least NEAR_MIN, at most NEAR_MAX): how far an implementation's own log-probs
    may honestly stray (the fused operation's GEMM). At sequence level (GSPO) d is one draw per sequence, every
    token of it gets the same log-ratio, so their mean over any mask is the sequence's (pass a floor that is one
    value per sequence: `sequence_floor`)."""
    batch, seq = logp.shape
    bound = _bounds(advantages, p, logp.shape)
    lo = torch.full_like(logp, NEAR_MIN) if floor is None else floor.to(logp).clamp(NEAR_MIN, NEAR_MAX)
    cols = 1 if p.importance_sampling_level == "sequence" else seq
    u = torch.rand(batch, cols, generator=gen, dtype=torch.float64).expand(batch, seq)
    sign = torch.where(torch.rand(batch, cols, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64).expand(batch, seq)
    size = torch.exp(torch.log(lo) + u * torch.log(NEAR_MAX / lo))
    return logp - torch.log(bound) - torch.log1p(sign * size)


def near_record(logp: torch.Tensor, x: Mapping[str, torch.Tensor], p: GrpoParameters, record: dict[str, Any],
                floor: torch.Tensor | None = None) -> None:
    """The realised relative distances |d| of the live tokens' ratios (of the sequences' at sequence level), as
    stored (`x["old_logprobs"]`), how many lie below and above their bound and, given `floor`, how many lie
    beyond it (where an honest implementation's branch is the reference's)."""
    keep = _live(x, logp.shape)
    log_r = logp - x["old_logprobs"].detach().to("cpu", torch.float64)
    bound = _bounds(x["advantages"], p, logp.shape)
    if p.importance_sampling_level == "sequence":  # one ratio per sequence with a live token
        m = keep.to(torch.float64)
        log_r = (log_r * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)
        floor = None if floor is None else sequence_floor(floor.to(m), keep)[:, :1]
        bound, keep = bound[:, :1], keep.any(-1, keepdim=True)
    d = torch.exp(log_r) / bound - 1.0
    if not keep.any():
        return
    record.update(min_abs=float(d[keep].abs().min()), max_abs=float(d[keep].abs().max()),
                  below=int((d[keep] < 0).sum()), above=int((d[keep] > 0).sum()))
    if floor is not None:
        record["beyond_allowance"] = int((d[keep].abs() > floor.to(d)[keep]).sum())
        record["live"] = int(keep.sum())


def near_tie_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], p: GrpoParameters, seed: int,
                    record: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A copy of `tensors` whose live tokens' ratios sit at their bound times (1 + d) (module docstring);
    `record` gets the realised relative distances' range and how many live tokens lie below and above their bound."""
    out = {k: v.clone() for k, v in tensors.items()}
    gen = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))
    out["logits"] = tie_rows(out["logits"], out["completion_ids"], gen)
    mix_signs(out, seed)
    logp = reference_logprobs(out, p).cpu()  # float64; a float32 kernel gets fp32(-log 2)
    old = near_old_logprobs(logp, out["advantages"], p, gen).to(torch.float32)
    out["old_logprobs"].copy_(old.to(out["old_logprobs"].device, out["old_logprobs"].dtype))
    if "ref_logprobs" in out:  # the KL term's gap away from 0, as exact_tie_inputs draws it
        tie_ref_logprobs(spec, out, gen)
    near_record(logp, out, p, record)
    return out
