"""Per-token log-probs (kind `token-logprobs`) far from the policy's own: the regions where real
implementations clamp. verl clamps the log-ratio at +-20 (and GSPO's log sequence ratio at 10), its
k3 KL the gap ref - logp at +-20 and the estimate at 10 (zero gradient beyond); the members declare
no clamp. The `far-ratios` probe's inputs (`far_ratio_inputs`) therefore reach |log r| = FAR_LOG
and, for members with reference log-probs, |ref - logp| = FAR_LOG, with one live token (sequence,
at sequence level) of each side within 1 of the far end, so a clamp anywhere below 24 shows.

The ordinary sets keep their gaps small (ratios 0.4 to 1.5x the top boundary, KL gaps 0.6-1.2 of
the sign of A: member_inputs): a token at r = e^25 dominates its row's scale, so there it would
hide other terms' errors.

A float16 gradient cannot hold e^25: where the gap makes the gradient grow (r above 1 with A < 0,
ref above logp) the far end is log(float16 max) - 4 (r up to ~1200) for float16 logits.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from grpo_conform.ops.grpo_logits.generators.knots import ratio_knots
from grpo_conform.ops.grpo_logits.member_inputs import _SALT, _cfg, draw_log_ratios
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_logprobs
from grpo_conform.ops.grpo_terms import VESPO_TOKEN_CLAMP
from grpo_conform.spec import MemberInputs, Spec

FAR_LOG = 25.0
FAR_ABOVE, FAR_BELOW = 3.0, 0.3  # the far sides start here: above 3 (PPO's dual clip, verl's clip_ratio_c), below 0.3


def far_log_cap(dtype: torch.dtype) -> float:
    """The largest log-gap whose e^gap a gradient of this dtype holds with room for A, weights and
    the upstream scalar."""
    return min(FAR_LOG, math.log(torch.finfo(dtype).max) - 4.0)


def far_ratio_intervals(p: GrpoParameters, cfg: MemberInputs, cap: float = FAR_LOG) -> list[tuple[float, float]]:
    """(3, e^cap) and (e^-FAR_LOG, 0.3) with every boundary of the member (1 - epsilon_low,
    1 + epsilon_high, delta, CISPO's cap) and `boundary_margin` around it cut out: far ratios, never ties."""
    out = [(FAR_ABOVE, math.exp(cap)), (math.exp(-FAR_LOG), FAR_BELOW)]
    for k in ratio_knots(p):
        lo, hi = k * (1 - cfg.boundary_margin), k * (1 + cfg.boundary_margin)
        out = [piece for a, b in out for piece in ((a, min(b, lo)), (max(a, hi), b)) if piece[1] > piece[0] * 1.01]
    return out


def _reach(values: torch.Tensor, where: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> None:
    """One element of `values` among `where` (drawn) set uniformly in [lo, hi]."""
    idx = where.nonzero().flatten()
    if idx.numel():
        k = idx[int(torch.randint(0, idx.numel(), (1,), generator=gen))]
        values[k] = lo + float(torch.rand(1, generator=gen, dtype=torch.float64)) * (hi - lo)


def far_ratio_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], seed: int,
                     covered: dict[str, Any] | None = None, logp: torch.Tensor | None = None,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A copy of `tensors` whose old log-probs put every token's ratio (every sequence's, at sequence
    level) far out on the side where the unclipped term is active: above 3 for a negative advantage,
    below 0.3 for a positive one, up to e^+-25 (boundaries cut out), so every live token carries the
    full -A * r gradient there. If the live sequences' advantages all have one sign, the largest one
    is negated, so that both tails are exercised. Reference log-probs, where the member has them, sit
    up to 25 from logp on both sides. Logits unchanged; an empty mask row gets one token live
    (its least likely token, batch >= 2). `covered` receives the reach of
    the gaps on live tokens (for the workload's draws). `logp` (float64 [B, S]) and `dtype` (the gradient's)
    for an operation whose logits are not among `tensors` (grpo-fused-linear: `Operation.policy_logprobs`,
    the hidden states' dtype); `tensors` then needs only the [B, S] grids and advantages."""
    out = {k: v.clone() for k, v in tensors.items()}
    if "old_logprobs" not in out:
        return out
    p = GrpoParameters.from_spec(spec, values)
    gen = torch.Generator().manual_seed((seed ^ _SALT ^ 0xFA2) & (2**63 - 1))
    batch, seq = out["completion_ids"].shape
    keep = (out["completion_mask"].cpu() != 0) if "completion_mask" in out else torch.ones(batch, seq, dtype=torch.bool)
    logp = reference_logprobs(out, p).cpu() if logp is None else logp  # per token: the mask does not enter it
    empty = (~keep.any(-1)).nonzero().flatten().tolist()
    if batch >= 2:
        # Both tails need a live sequence each: with an empty row in a batch of two (the mask layouts rotate
        # with the input sets), one tail went unexercised. Its least likely token is made live (a near
        # one-hot row would hide the ratio; empty rows are judged by the other probes).
        for b in empty:
            t = int(torch.argmin(logp[b]))
            keep[b, t] = True
            out["completion_mask"][b, t] = 1
    adv = out["advantages"].detach().to("cpu", torch.float64)
    live = keep.any(-1) & (adv != 0)
    for sign in (1.0, -1.0):  # both signs among the live sequences where there are two of them
        if int(live.sum()) >= 2 and not (live & (adv * sign < 0)).any():
            b = int(torch.argmax(torch.where(live, adv.abs(), torch.zeros_like(adv))))
            out["advantages"][b] = -out["advantages"][b]
            adv[b] = -adv[b]
    cap = far_log_cap(out["logits"].dtype if dtype is None else dtype)
    intervals = far_ratio_intervals(p, _cfg(spec), cap)
    high = [iv for iv in intervals if iv[0] > 1.0] or intervals
    low = [iv for iv in intervals if iv[1] < 1.0] or intervals
    sequence = p.importance_sampling_level == "sequence"
    n = batch if sequence else batch * seq
    up, down = draw_log_ratios(n, high, gen), draw_log_ratios(n, low, gen)
    top, bottom = math.log(high[-1][1]), math.log(low[0][0])
    # The far ends on the live sequence of largest |A| of each sign (a tiny A would hide them).
    for values_, side, lo_, hi_ in ((up, adv < 0, top - 1.0, top), (down, adv > 0, bottom, bottom + 1.0)):
        rows = keep.any(-1) & side
        if rows.any():
            b = int(torch.argmax(torch.where(rows, adv.abs(), torch.full_like(adv, -1.0))))
            if sequence:
                where = torch.arange(batch) == b
            else:  # its least likely live token: a near one-hot row would hide the ratio (1 - p ~ 0)
                t = int(torch.argmin(torch.where(keep[b], logp[b], torch.full_like(logp[b], math.inf))))
                where = torch.zeros(batch * seq, dtype=torch.bool)
                where[b * seq + t] = True
            _reach(values_, where, lo_, hi_, gen)
    if sequence:
        log_r = torch.where(adv < 0, up, down)[:, None].expand(batch, seq)
    else:
        log_r = torch.where(adv[:, None] < 0, up.view(batch, seq), down.view(batch, seq))
    out["old_logprobs"].copy_((logp - log_r).to(out["old_logprobs"].dtype))
    reach: dict[str, Any] = {"log_ratio": _span(log_r, keep)}
    if "ref_logprobs" in out:
        gap = far_ref_gaps(batch, seq, keep, cap, gen)
        out["ref_logprobs"].copy_((logp + gap).to(out["ref_logprobs"].dtype))
        reach["ref_gap"] = _span(gap, keep)
    if covered is not None:
        covered.update(reach)
    return out


def vespo_clamp_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], seed: int,
                       covered: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """VESPO clamps each token's log-ratio to +-20, then the row's sum to [log 1e-8, 20] (TRL 1.16). A far row
    pushed one way hides the first clamp behind the second (both cut at 20), so here every row with 3 kept
    tokens or more holds one token 2-5 beyond +-20 (its side drawn) and its other kept tokens on the other
    side, sized so that the clamped sum lands within 0.5 of phi's peak, log(k / lambda): a kernel that clamps
    only the sum sees a sum 2-5 further out, where phi differs by a factor of 1.3 at least (k >= 0.5). Other
    rows keep ratio 1. Logits, mask and advantages unchanged."""
    out = {k: v.clone() for k, v in tensors.items()}
    if "old_logprobs" not in out:
        return out
    p = GrpoParameters.from_spec(spec, values)
    gen = torch.Generator().manual_seed((seed ^ _SALT ^ 0x7E5) & (2**63 - 1))
    batch, seq = out["completion_ids"].shape
    keep = (out["completion_mask"].cpu() != 0) if "completion_mask" in out else torch.ones(batch, seq, dtype=torch.bool)
    logp = reference_logprobs(out, p).cpu()
    adv = out["advantages"].detach().to("cpu", torch.float64)
    log_r = torch.zeros(batch, seq, dtype=torch.float64)
    rows = 0
    for b in range(batch):
        idx = keep[b].nonzero().flatten()
        if idx.numel() < 3:
            continue
        u = torch.rand(4, generator=gen, dtype=torch.float64).tolist()
        side = 1.0 if u[0] < 0.5 else -1.0
        k, lam = (p.vespo_k_pos, p.vespo_lambda_pos) if adv[b] >= 0 else (p.vespo_k_neg, p.vespo_lambda_neg)
        target = math.log(max(k, 1e-300) / max(lam, 1e-4)) + (u[1] - 0.5)
        far = int(idx[int(u[2] * idx.numel()) % idx.numel()])
        rest = idx[idx != far]
        noise = torch.randn(rest.numel(), generator=gen, dtype=torch.float64) * 0.5
        log_r[b, rest] = (target - side * VESPO_TOKEN_CLAMP) / rest.numel() + noise - noise.mean()
        log_r[b, far] = side * (VESPO_TOKEN_CLAMP + 2.0 + 3.0 * u[3])
        rows += 1
    out["old_logprobs"].copy_((logp - log_r).to(out["old_logprobs"].dtype))
    if covered is not None:
        covered.update({"rows": rows, "log_ratio": _span(log_r, keep)})
    return out


#: the running product of a row's sampling ratios must leave float32's range (e^-103 below, e^88.7 above) part
#: way along the row: the partial log-sum reaches +-SAMPLING_SWING
SAMPLING_SWING = 112.0


def sampling_product_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], seed: int,
                            covered: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """vLLM's sequence modes weight a sequence by exp of its kept tokens' summed log sampling ratios. The drawn
    sets spread the tokens around q_b^(1/n), so every partial product stays in range and a float32 running
    product of the ratios equals it (the twenty-eighth round's `vllm-seq-running-product`). Here every row
    with 4 kept tokens or more keeps its q_b, but its first half of kept tokens moves one way (each at most
    e^+-56) and its second half back: the partial log-sum reaches SAMPLING_SWING, down or up (drawn per row), where a
    float32 running product is 0 or inf for good. Other rows, masked tokens, logits and log-probs unchanged."""
    out = {k: v.clone() for k, v in tensors.items()}
    p = GrpoParameters.from_spec(spec, values)
    if "sampling_ratio" not in out or not p.vllm_importance_sampling_mode.startswith("sequence"):
        return out
    gen = torch.Generator().manual_seed((seed ^ _SALT ^ 0x5A3) & (2**63 - 1))
    batch, seq = out["completion_ids"].shape
    keep = (out["completion_mask"].cpu() != 0) if "completion_mask" in out else torch.ones(batch, seq, dtype=torch.bool)
    log_rho = torch.log(out["sampling_ratio"].detach().to("cpu", torch.float64))
    rows, swing = 0, []
    for b in range(batch):
        idx = keep[b].nonzero().flatten()
        n = idx.numel()
        if n < 4:
            continue
        q = float(log_rho[b, idx].sum())
        h = n // 2
        side = -1.0 if float(torch.rand(1, generator=gen)) < 0.5 else 1.0
        d = SAMPLING_SWING / h
        log_rho[b, idx[:h]] = q / n + side * d
        log_rho[b, idx[h:]] = q / n - side * d * h / (n - h)
        rows += 1
        swing.append(side * SAMPLING_SWING)
    out["sampling_ratio"].copy_(torch.exp(log_rho).to(out["sampling_ratio"].dtype))
    if covered is not None:
        covered.update({"rows": rows, "partial_log_sum": sorted(set(swing))})
    return out


def far_ref_gaps(batch: int, seq: int, keep: torch.Tensor, cap: float, gen: torch.Generator) -> torch.Tensor:
    """ref - logp per token: both signs, |gap| uniform in [0.5, 25] (the positive side to `cap`),
    one live token within 1 of each far end."""
    sign = torch.where(torch.rand(batch, seq, generator=gen) < 0.5, -1.0, 1.0).double()
    size = 0.5 + torch.rand(batch, seq, generator=gen, dtype=torch.float64) * (FAR_LOG - 0.5)
    gap = (sign * size).clamp(max=cap).view(-1)
    flat = keep.reshape(-1)
    _reach(gap, flat, cap - 1.0, cap, gen)
    _reach(gap, flat & (gap < cap - 1.0), -FAR_LOG, -FAR_LOG + 1.0, gen)
    return gap.view(batch, seq)


def _span(values: torch.Tensor, keep: torch.Tensor) -> list[float]:
    v = values[keep]
    return [round(float(v.min()), 3), round(float(v.max()), 3)] if v.numel() else []
