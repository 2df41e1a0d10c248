"""generators/near_ties.py and ops/fused_linear/near_ties.py (the near-ties probe's T-near call): every live ratio sits at its bound times
(1 + d), |d| in [NEAR_MIN, NEAR_MAX] on both sides; a float32 ratio picks the reference's branch on every
token, a ratio rounded to bfloat16 or float16 flips some."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from member_cases import member_spec

from grpo_conform.ops.grpo_logits.generators.near_ties import (NEAR_MAX, NEAR_MIN, near_tie_inputs,
                                                               near_tie_reason)
from grpo_conform.ops.grpo_logits.reference import reference_logprobs
from grpo_conform.ops.grpo_terms import GrpoParameters
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear.reference import row_stats
from grpo_conform.ops.fused_linear.tolerance import logprob_allowance
from grpo_conform.spec import load_family


def _inputs(seed: int, batch: int = 6, seq: int = 40, vocab: int = 300, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, seq, generator=g) < 0.8).long()
    return {"logits": torch.randn(batch, seq + 1, vocab, generator=g).to(dtype),
            "completion_ids": torch.randint(0, vocab, (batch, seq), generator=g),
            "advantages": torch.tensor([0.7, -1.2, 0.3, -0.4, 1.5, -2.0][:batch]),
            "old_logprobs": torch.zeros(batch, seq), "ref_logprobs": torch.zeros(batch, seq),
            "completion_mask": mask}


def _branches(x, p, ratio_dtype=None):
    """(unclipped where A's bound decides, per live token) from a float32 ratio, or one rounded to ratio_dtype."""
    logp32 = reference_logprobs(x, p).float()  # what a float32 kernel gets on tie rows: fp32(-log 2)
    r = torch.exp(logp32 - x["old_logprobs"])
    if ratio_dtype is not None:
        r = r.to(ratio_dtype).float()
    a = x["advantages"][:, None].expand_as(r)
    unclipped = torch.where(a > 0, r <= 1 + p.epsilon_high, r >= 1 - p.epsilon_low)
    return unclipped[x["completion_mask"] != 0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ratios_sit_beside_the_bound_and_only_a_narrower_dtype_flips_them(seed):
    p = GrpoParameters(epsilon_low=0.2, epsilon_high=0.28, temperature=0.9)
    record: dict = {}
    x = near_tie_inputs(member_spec("token-offpolicy-mask"), _inputs(seed), p, seed, record)
    assert NEAR_MIN * 0.99 <= record["min_abs"] and record["max_abs"] <= NEAR_MAX * 1.01
    assert record["below"] > 20 and record["above"] > 20
    truth = (reference_logprobs(x, p) - x["old_logprobs"].double()).exp()
    a = x["advantages"][:, None].double().expand_as(truth)
    want = torch.where(a > 0, truth <= 1 + p.epsilon_high, truth >= 1 - p.epsilon_low)[x["completion_mask"] != 0]
    assert torch.equal(_branches(x, p), want)  # float32: every token on the reference's side
    for narrow in (torch.bfloat16, torch.float16):
        flipped = int((_branches(x, p, narrow) != want).sum())
        assert flipped >= 3, narrow


def test_the_kl_gap_stays_away_from_zero_and_the_input_set_is_not_changed():
    p = GrpoParameters(epsilon_low=0.1, epsilon_high=0.15, temperature=1.0, beta=0.04)
    x = _inputs(5)
    before = {k: v.clone() for k, v in x.items()}
    spec = member_spec("token-offpolicy-mask-kl")
    y = near_tie_inputs(spec, x, p, 5, {})
    assert all(torch.equal(x[k], before[k]) for k in x)
    gap = (y["ref_logprobs"].double() - reference_logprobs(y, p))[y["completion_mask"] != 0]
    assert float(gap.abs().min()) > 0.09
    cfg = spec.validation.member_inputs  # the spec's declared gaps, as exact_tie_inputs draws them
    assert cfg.ref_gap_min - 1e-6 <= float(gap.abs().min()) and float(gap.abs().max()) <= cfg.ref_gap_max + 1e-6


def test_where_it_applies():
    p = GrpoParameters(epsilon_low=0.2, epsilon_high=0.2, temperature=1.0)
    names = {"logits", "completion_ids", "advantages", "old_logprobs"}
    assert near_tie_reason(p, names) is None
    assert "old log-probs" in near_tie_reason(p, names - {"old_logprobs"})
    for lt in ("cispo", "sapo", "vespo"):
        assert "no hard clip" in near_tie_reason(GrpoParameters(0.2, 0.2, 1.0, loss_type=lt), names)
    assert near_tie_reason(GrpoParameters(0.2, 0.2, 1.0, importance_sampling_level="sequence"), names) is None


def _sequence_branches(x, p, ratio_dtype=None):
    """(unclipped, per sequence with a live token) from a float32 GSPO ratio exp(mean of the log-ratios), or one
    rounded to ratio_dtype, and the reference's."""
    m = (x["completion_mask"] != 0)
    out = []
    for logp in (reference_logprobs(x, p).float(), reference_logprobs(x, p)):
        lr = ((logp - x["old_logprobs"].to(logp.dtype)) * m).sum(-1) / m.sum(-1).clamp(min=1)
        r = torch.exp(lr)
        if ratio_dtype is not None and logp.dtype == torch.float32:
            r = r.to(ratio_dtype).float()
        a = x["advantages"].to(r.dtype)
        out.append(torch.where(a > 0, r <= 1 + p.epsilon_high, r >= 1 - p.epsilon_low)[m.any(-1)])
    return out


def test_sequence_level_ratios_sit_beside_the_bound():
    """GSPO: one distance per sequence, every token of it at the same log-ratio, so the mean over the mask is the
    sequence's; a float32 sequence ratio takes the reference's branch, a bf16 one flips some over the seeds."""
    p = GrpoParameters(epsilon_low=3e-4, epsilon_high=4e-4, temperature=0.9, importance_sampling_level="sequence")
    flipped = 0
    for seed in range(12):
        record: dict = {}
        x = near_tie_inputs(member_spec("sequence-offpolicy-mask"), _inputs(seed), p, seed, record)
        assert NEAR_MIN * 0.99 <= record["min_abs"] and record["max_abs"] <= NEAR_MAX * 1.01
        assert record["below"] + record["above"] == int((x["completion_mask"] != 0).any(-1).sum())
        f32, want = _sequence_branches(x, p)
        assert torch.equal(f32, want)
        flipped += int((_sequence_branches(x, p, torch.bfloat16)[0] != want).sum())
    assert flipped >= 3, flipped


# -- grpo-fused-linear: the logits quieted first (ops/fused_linear/near_ties.py) ---------------------------------

FUSED = load_family(Path(__file__).resolve().parent.parent / "specs" / "grpo-fused-linear.v1.json")


def _fused(member: str, seed: int, workload: str = "odd-bf16"):
    spec = FUSED.member(member)
    op = operation_for(spec)
    model = ReferenceModel.drawn(spec, random.Random(seed))
    x = op.generate(spec, spec.resolve(spec.workload(workload)), seed, "cpu", values=model.values, case=seed).tensors
    return spec, op, model.params, x


def _fused_branches(x, p, upcast: bool, ratio_dtype=None):
    """(unclipped, per live token) as an eager fused kernel decides it: the GEMM in the operands' dtype (torch's
    bf16 linear rounds the logits) or upcast to float32, a float32 log-softmax, the ratio maybe narrowed."""
    h, w, b = x["hidden"], x["weight"], x.get("bias")
    z = F.linear(h.float(), w.float(), None if b is None else b.float()) if upcast else F.linear(h, w, b).float()
    logp = torch.log_softmax(z / p.temperature, -1).gather(-1, x["completion_ids"].long()[..., None])[..., 0]
    r = torch.exp(logp - x["old_logprobs"].float())
    if ratio_dtype is not None:
        r = r.to(ratio_dtype).float()
    a = x["advantages"].float()[:, None].expand_as(r)
    return torch.where(a > 0, r <= 1 + p.epsilon_high, r >= 1 - p.epsilon_low)[x["completion_mask"] != 0]


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "token-offpolicy-mask-kl-ref-weight", "dapo-mask",
                                    "sequence-offpolicy-mask"])
def test_fused_near_ties_pass_honest_gemms_and_catch_a_bf16_ratio(member):
    flipped = 0
    for seed in range(4):
        spec, op, p, x = _fused(member, seed)
        before = {k: v.clone() for k, v in x.items()}
        record: dict = {}
        y = op.near_tie_inputs(spec, x, p, seed, record)
        assert all(torch.equal(x[k], before[k]) for k in x)  # a copy: the generated set is not changed
        assert record["beyond_allowance"] == record["live"] > 0  # every live token is decisive
        assert record["max_abs"] <= NEAR_MAX * 1.01 and record["min_abs"] >= NEAR_MIN
        logp = row_stats(y, p).logp.reshape(y["completion_ids"].shape)
        truth = (logp - y["old_logprobs"].double()).exp()
        a = y["advantages"].double()[:, None].expand_as(truth)
        want = torch.where(a > 0, truth <= 1 + p.epsilon_high, truth >= 1 - p.epsilon_low)[y["completion_mask"] != 0]
        for upcast in (False, True):  # bf16 logits (the allowance's u |z|) and an fp32 upcast: no token flips
            assert torch.equal(_fused_branches(y, p, upcast), want), (seed, upcast)
        flipped += int((_fused_branches(y, p, True, torch.bfloat16) != want).sum())
        # only powers of two scale the hidden rows (exact in bf16): the set stays the operands' own values
        h0 = x["hidden"].double().reshape(-1, x["hidden"].shape[-1])
        h1 = y["hidden"].double().reshape(h0.shape)
        nz = h0.abs().amax(-1) > 0
        k = torch.log2(h1[nz].abs().amax(-1) / h0[nz].abs().amax(-1))
        assert torch.equal(k, k.round()) and bool((k <= 0).all())
    assert flipped >= 5, flipped


def test_fused_drawn_logits_would_hide_the_band():
    """Why the logits are quieted: at the drawn heads the log-probs' allowance in bf16 exceeds bf16's ratio band
    (3.3e-3 at 1.2) on some token of every set, so an honest GEMM's ratio may fall on either side there."""
    for seed in range(3):
        spec, op, p, x = _fused("token-offpolicy-mask", seed)
        drawn = logprob_allowance(x, p)
        quiet = logprob_allowance(op.near_tie_inputs(spec, x, p, seed, {}), p)
        assert float(drawn.max()) > 3.3e-3 > NEAR_MAX / 2 > 2 * float(quiet.max()), (seed, float(drawn.max()))


def test_fused_kl_gap_sits_at_the_declared_gaps():
    spec, op, p, x = _fused("token-offpolicy-mask-kl", 3)
    y = op.near_tie_inputs(spec, x, p, 3, {})
    gap = (y["ref_logprobs"].double() - row_stats(y, p).logp.reshape(y["completion_ids"].shape))
    gap = gap[y["completion_mask"] != 0].abs()
    cfg = spec.validation.member_inputs
    assert cfg.ref_gap_min - 1e-5 <= float(gap.min()) and float(gap.max()) <= cfg.ref_gap_max + 1e-5
