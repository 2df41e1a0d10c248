"""How far dL/dlogp (and each token's loss) moves when the log-probs err by at most d: the third step of
the fused operation's allowance (`tolerance.py`; docs/operations.md, "Tolerances of the fused
operation"). Closed-form terms from `grpo_terms.token_terms`, moved by shifts of the log-probs within
[-d, d] chosen where a branch of the clip changes (`bound_shifts`), and, with reference log-probs
from a GEMM of their own, the KL term's independent move (`coefficient_moves`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from grpo_conform.ops.grpo_terms import GrpoParameters, token_terms

# A bound shift's offset to either side of the bound, relative to the magnitudes the log-ratio is formed
# from (1 + |logp| + |old|): float64 rounds logp + s - old within ~2^-52 of them, 2^12 times less.
HAIR = 2.0**-40


def bound_shifts(x, p: GrpoParameters, logp: torch.Tensor, grid: torch.Tensor) -> list[torch.Tensor]:
    """Log-prob shifts within [-d, d] where dL/dlogp is most apart from its value at logp: the two ends
    (the KL term and an active ratio term are monotone in logp) and, where a clip bound of the ratio lies
    inside, the shifts that put the ratio on it: a hair (`HAIR`) to either side, so that the active
    branch's largest value before the clipped branch's 0 is met whichever side is active there. An
    exact shift does not land exactly on the bound: logp + s - old and exp(log(1 + eps)) round to
    either side of it in float64 (28% of such shifts fell on the clipped side over 26 values of eps in
    [0.1, 0.35], most of them at some). For A > 0 at the upper bound, whose active branch is largest
    there, only the end at -d then counted, whose ratio lies e^(d - s0) below the bound: the fused
    operation's kl-ref-weight member failed at seed-b16 by 1-3% (docs/operations.md). At sequence
    level the sequence's ratio moves with the mean shift of its tokens: each token shifted by the same
    fraction of its own d, up to the whole of it, so that the mean reaches the bound whenever the mean
    of d does."""
    out = [grid, -grid]
    if "old_logprobs" not in x:
        return out
    old = x["old_logprobs"].to(torch.float64)
    log_ratio = logp - old
    hair = HAIR * (1.0 + logp.abs() + old.abs())  # far above the rounding of logp + s - old, far below any d
    sequence = p.importance_sampling_level == "sequence"
    if sequence:
        m = (x["completion_mask"] != 0).to(torch.float64) if "completion_mask" in x else torch.ones_like(logp)
        n = m.sum(-1, keepdim=True).clamp_min(1.0)
        log_ratio = ((log_ratio * m).sum(-1, keepdim=True) / n).expand_as(logp)
        reach = ((grid * m).sum(-1, keepdim=True) / n).expand_as(logp)  # the largest move of the mean
        hair = (hair * m).sum(-1, keepdim=True).expand_as(logp)  # the mean's rounding grows with its terms
    for bound in (1.0 - p.epsilon_low, 1.0 + p.epsilon_high):
        if bound <= 0:
            continue
        for to_bound in (math.log(bound) - log_ratio - hair, math.log(bound) - log_ratio + hair):
            if sequence:
                # Every token moved by the same fraction of its own d: the sequence's log-ratio (their mean)
                # reaches the bound whenever the mean of d does. Clipping one shift to each token's d (as at
                # token level) moved the mean less than it can move, and a sequence the implementation's
                # arithmetic put across a bound was not covered (docs/operations.md: TRL's fused route, 1 run in 16).
                scale = torch.where(reach > 0, to_bound / reach.clamp_min(1e-300), torch.zeros_like(reach))
                out.append(grid * scale.clamp(-1.0, 1.0))
            else:
                out.append(torch.maximum(torch.minimum(to_bound, grid), -grid))
    return out


def coefficient_moves(x, p: GrpoParameters, logp: torch.Tensor, d: torch.Tensor, own_reference: bool):
    """(g = dL/dlogp, dg, each token's loss move) on the [B, T] grid, every log-prob within d of logp.

    Given reference log-probs (or none) the KL gap ref - logp moves with logp itself, so one shift
    moves the ratio and the KL term together, as the implementation's error does. Reference log-probs
    of their own GEMM (`own_reference`; their error d_ref is part of d) err independently of the policy's: at a clip crossing the
    ratio must sit near the bound (a policy error of s0 only) while the reference's error moves the KL
    gap a further d_ref the same way, which no common shift reaches (it covered the bound with the KL
    moved by s0, or the KL moved by d with the ratio e^(d - s0) short of the bound). There the terms that
    read only the policy's log-probs (`beta` 0) take their largest move over the shifts, and the KL
    term adds its own bound at d (its smooth move, exact for k3: monotone in the gap)."""
    tt = token_terms(x, p, logp, logp_error=d)  # with logp_error given, coef_error and loss_error are tensors
    own, base = p, tt
    if own_reference and p.beta != 0.0:
        own = replace(p, beta=0.0)
        base = token_terms(x, own, logp, logp_error=d)
    dg, loss_move = base.coef_error.clone(), base.loss_error.clone()
    for shift in bound_shifts(x, p, logp, d):  # a bound crossed within d
        moved = token_terms(x, own, logp + shift)
        dg = torch.maximum(dg, (moved.dlogp - base.dlogp).abs())
        loss_move = torch.maximum(loss_move, (moved.loss - base.loss).abs())
    # the KL part's own move (0 where `own` is p)
    dg = torch.maximum(tt.coef_error, dg + (tt.coef_error - base.coef_error))
    loss_move = torch.maximum(tt.loss_error, loss_move + (tt.loss_error - base.loss_error))
    return tt.dlogp, dg, loss_move
