"""The fused allowance at a clip crossing (ops/fused_linear/moves.py): a token whose ratio lies within d of
the bound on the clipped side may be active in an honest implementation's arithmetic, and dL/dlogp then
jumps by the active branch's value at the bound. The allowance must hold that jump for every such token.

Until 2026-12-03 it was evaluated at one shift computed to land exactly on the bound, which float64
rounds to either side: on the clipped side the jump was lost and only the ends at +-d counted, whose
ratio is e^(d - s0) short of the bound. triton-fused failed `token-offpolicy-mask-kl-ref-weight` at
seed-b16 by 1-3% on a few d weight elements (benchmarks/results/h200-2026-12-03e/round23); only that
member, because there d = d_pol + d_ref (the reference lm_head's error too) outgrows the probabilities'
slack expm1(2 E) that covers the shortfall elsewhere. The eager bf16 path below, on inputs whose old
log-probs sit between its ratio and the reference's at a bound, failed the same way on 5 of 30 seeds.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.units import judge_units
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear import moves
from grpo_conform.ops.fused_linear.reference import logprobs_and_lse
from grpo_conform.ops.fused_linear.tolerance import GemmAllowance
from grpo_conform.ops.grpo_terms import GrpoParameters, token_terms
from grpo_conform.spec import load_family

ROOT = Path(__file__).resolve().parent.parent
MEMBER = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json").member("token-offpolicy-mask-kl-ref-weight")


def _beyond_the_bound(n: int, seed: int, upper: bool):
    """n tokens (one sequence each) whose ratio lies s0 in (0, d) beyond a clip bound, on the clipped
    side for their advantage's sign: A > 0 above 1 + eps_high, A < 0 below 1 - eps_low."""
    g = torch.Generator().manual_seed(seed)
    p = GrpoParameters.from_mapping({"epsilon_low": 0.2, "epsilon_high": 0.28, "temperature": 1.0})
    logp = -12.0 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    d = 0.01 + 0.2 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    s0 = d * torch.rand(n, 1, generator=g, dtype=torch.float64)
    bound = 1.0 + p.epsilon_high if upper else 1.0 - p.epsilon_low
    log_ratio = math.log(bound) + (s0 if upper else -s0)
    x = {"old_logprobs": logp - log_ratio, "completion_ids": torch.zeros(n, 1, dtype=torch.int64),
         "advantages": torch.full((n,), 0.7 if upper else -0.7, dtype=torch.float64),
         "completion_mask": torch.ones(n, 1, dtype=torch.bool)}
    return x, p, logp, d, bound


@pytest.mark.parametrize("upper", [True, False], ids=["upper-A>0", "lower-A<0"])
def test_every_token_within_d_of_a_bound_is_allowed_the_jump_to_the_active_branch(upper, monkeypatch):
    x, p, logp, d, bound = _beyond_the_bound(4000, 7, upper)
    g, dg, _ = moves.coefficient_moves(x, p, logp, d, own_reference=False)
    assert bool((g == 0).all())  # clipped in float64
    w = 1.0 / x["advantages"].numel()  # grpo's token weight 1 / (B n_b), one token a sequence
    jump = w * 0.7 * bound  # |dL/dlogp| of the active branch at the bound
    assert bool((dg >= jump * (1 - 1e-9)).all()), int((dg < jump * (1 - 1e-9)).sum())
    # the test tells the defect apart: shifts computed to land on the bound itself (no hair) lose the
    # jump at the upper bound wherever float64 puts them on the clipped side (here 3328 of 4000 tokens;
    # the share depends on how exp(log(1 + eps)) rounds: 28% over 26 values of eps in [0.1, 0.35]). At the lower bound (A < 0) the active branch's |A| r grows away from the bound: the end
    # at +d holds more than the jump, and nothing was lost there.
    monkeypatch.setattr(moves, "HAIR", 0.0)
    _, dg0, _ = moves.coefficient_moves(x, p, logp, d, own_reference=False)
    lost = int((dg0 < jump * (1 - 1e-9)).sum())
    assert (200 < lost < 3800) if upper else lost == 0, lost


def test_a_reference_lm_head_moves_the_kl_gap_apart_from_the_ratio():
    """At a crossing the ratio sits at the bound (the policy's error s0), while the reference log-prob of
    its own GEMM may move the KL gap by d_ref further the same way: one shift of both reaches neither."""
    p = GrpoParameters.from_mapping({"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0, "beta": 0.1})
    logp = torch.tensor([[-2.0]], dtype=torch.float64)
    d_pol, d_ref, s0 = 0.05, 0.05, 0.045  # a crossing that takes nearly all of the policy's error
    hi = math.log(1.2)
    x = {"old_logprobs": logp - (hi + s0), "completion_ids": torch.zeros(1, 1, dtype=torch.int64),
         "advantages": torch.tensor([0.3], dtype=torch.float64), "completion_mask": torch.ones(1, 1, dtype=torch.bool),
         "ref_logprobs": logp + 2.5}  # a large KL gap: the KL term's slope beta e^2.5 exceeds A
    d = torch.tensor([[d_pol + d_ref]], dtype=torch.float64)
    g = token_terms(x, p, logp).dlogp
    # one honest corner: the policy's log-prob s0 (and a hair) down, the ratio active; the reference's d_ref up
    corner = dict(x, ref_logprobs=x["ref_logprobs"] + d_ref)
    real = float((token_terms(corner, p, logp - s0 - 1e-12).dlogp - g).abs())
    _, dg, _ = moves.coefficient_moves(x, p, logp, d, own_reference=True)
    assert float(dg) >= real
    _, coupled, _ = moves.coefficient_moves(x, p, logp, d, own_reference=False)  # right for given ref log-probs
    assert float(coupled) < real


def test_the_implementations_rounding_covers_the_allowed_move_too():
    """A crossing token whose reference d logits are ~0 has d logits as large as its whole allowance, and
    the implementation rounds those (and the gradient it sums them into) to bf16 as well: 2u of the
    reference scale alone left that rounding out wherever the reference is ~0."""
    u = 2.0**-8
    model = GemmAllowance({"weight": torch.tensor([1e-3, 2e-3], dtype=torch.float64)}, 2 * u, 0.0, 0.0)
    scale = torch.tensor([0.0, 5e-3], dtype=torch.float64)
    got = model.allowance("weight", 0, 2, scale)
    assert torch.allclose(got, torch.tensor([1e-3, 2e-3], dtype=torch.float64) * (1 + 2 * u) + 2 * u * scale, rtol=1e-15)


def _eager(x, p, grad=True):
    """The eager bf16 path of the member: bf16 logits GEMMs (policy and reference), float32 log-softmax and
    loss terms, gradients by autograd (d logits rounded to bf16 on the way back)."""
    h = x["hidden"].clone().requires_grad_(grad)
    w = x["weight"].clone().requires_grad_(grad)
    ids = x["completion_ids"].long().unsqueeze(-1)
    logp = torch.log_softmax(F.linear(h, w).float() / p.temperature, -1).gather(-1, ids).squeeze(-1)
    with torch.no_grad():
        zr = F.linear(x["ref_hidden"], x["ref_weight"]).float()
        ref = torch.log_softmax(zr / p.temperature, -1).gather(-1, ids).squeeze(-1)
    if not grad:
        return logp.detach().double()
    r = torch.exp(logp - x["old_logprobs"].float())
    adv = x["advantages"].float()[:, None]
    per = -torch.minimum(r * adv, r.clamp(1 - p.epsilon_low, 1 + p.epsilon_high) * adv)
    gap = ref - logp
    per = per + p.beta * (torch.exp(gap) - gap - 1)
    m = (x["completion_mask"] != 0).float()
    loss = ((per * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()
    loss.backward()
    return float(loss.detach()), {"hidden": h.grad, "weight": w.grad}


def _between(x, p, frac: float = 0.3) -> int:
    """Old log-probs that put every usable token's reference ratio `frac` of the eager path's own log-prob
    error beyond the bound (clipped) and the eager path's ratio inside it (active)."""
    logp = logprobs_and_lse(x, p)[0]
    err = _eager(x, p, grad=False) - logp
    adv = x["advantages"].double()[:, None].expand_as(logp)
    hi, lo = math.log(1 + p.epsilon_high), math.log(1 - p.epsilon_low)
    log_ratio = torch.where(adv > 0, hi - frac * err, lo - frac * err)
    usable = ((adv > 0) & (err < 0)) | ((adv < 0) & (err > 0))
    x["old_logprobs"].copy_(torch.where(usable, logp - log_ratio, x["old_logprobs"].double()))
    return int(usable.sum())


def _judge(seed: int):
    op = operation_for(MEMBER)
    rw = MEMBER.resolve(MEMBER.workload("odd-bf16"))
    model = ReferenceModel.drawn(MEMBER, random.Random(seed))
    x = op.generate(MEMBER, rw, seed, "cpu", values=model.values, case=seed).tensors
    assert _between(x, model.params) > 0
    loss, grads = _eager(x, model.params)
    dtype = rw.dtypes["hidden"]
    em = op.error_model(MEMBER, x, model.params, dtype)
    return judge_units(op, MEMBER, rw, MEMBER.tolerance(dtype), model.params, x, loss, grads, 1.0, em,
                       op.gradient_groupings(MEMBER), 1e-40, model.loss(x))


SEEDS = [1, 2, 12, 16, 19]  # of 0..29, those whose d weight failed under the exact bound shift (this CPU)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_eager_bf16_path_passes_with_its_ratios_across_a_bound(seed):
    loss_cmp, cmps = _judge(seed)
    assert loss_cmp.passed and cmps.passed, {n: c.describe() for n, c in cmps.by_name.items()}


def test_the_eager_path_across_a_bound_failed_under_the_exact_bound_shift(monkeypatch):
    """The same judgments with the hair taken away: d weight fails on some of those seeds (the bf16
    GEMM's rounding is the CPU library's, so which seeds may differ between machines; on this one all
    five failed under the old allowance, and 1 and 16 still fail with only the allowance's own rounding
    widened: `test_the_implementations_rounding_covers_the_allowed_move_too`)."""
    monkeypatch.setattr(moves, "HAIR", 0.0)
    failed = [s for s in SEEDS if not _judge(s)[1].passed]
    assert failed, "no seed failed without the hair: the crossing cases above no longer test anything"
