"""The fused reference's row pass (grpo_conform/ops/fused_linear/row_pass.py): the error model's row statistics,
made online beside the log-sum-exp, equal the dense formula of tolerance.py; the log-sum-exp is bitwise the
one the pass makes without them; a row of NaN stays in its row."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.model import ReferenceModel
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear.reference import Blocks
from grpo_conform.ops.fused_linear.row_pass import FP32_U, UNIT_ROUNDOFF, flat, row_pass
from grpo_conform.spec import load_family

ROOT = Path(__file__).resolve().parent.parent
FAMILY = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")


def _inputs(member: str, workload: str, seed: int):
    spec = FAMILY.member(member)
    op = operation_for(spec)
    rw = spec.resolve(spec.workload(workload))
    model = ReferenceModel.drawn(spec, random.Random(seed))
    return op.generate(spec, rw, seed, "cpu", values=model.values, case=seed).tensors, model.params


def _dense(x, temperature: float, u: float, prefix: str = ""):
    """tolerance.py's per-row statistics from the whole [N, V] logits at once."""
    h, w, b = flat(x, prefix)
    h, w = h.to(torch.float64), w.to(torch.float64)
    z = h @ w.T + (0.0 if b is None else b.to(torch.float64))
    e = u * z.abs() + math.sqrt(h.shape[1]) * FP32_U * h.norm(dim=-1)[:, None] * w.norm(dim=-1)[None, :]
    p = torch.softmax(z / temperature, dim=-1)
    c = x["completion_ids"].reshape(-1).to(torch.int64)
    rows = torch.arange(len(c))
    weight = p.clone()
    weight[rows, c] = 1.0 - p[rows, c]
    return e.max(-1).values, z.abs().max(-1).values, (weight * e).sum(-1), torch.logsumexp(z / temperature, -1)


@pytest.mark.parametrize("member, prefix", [("token-is-bias", ""), ("token-offpolicy-mask-kl-ref-weight", "ref_"),
                                            ("token-offpolicy-mask-kl-ref-weight", "")])
@pytest.mark.parametrize("blocks", [Blocks(5, 97), Blocks(64, 7), Blocks(1000, 4096)])
def test_the_online_statistics_equal_the_dense_formula(member, prefix, blocks):
    x, p = _inputs(member, "odd-bf16", 3)
    u = UNIT_ROUNDOFF["bfloat16"]
    rows = row_pass(x, p.temperature, blocks, prefix, u=u)
    emax, zmax, d, lse = _dense(x, p.temperature, u, prefix)
    assert torch.equal(rows.errors.emax, emax) and torch.equal(rows.errors.zmax, zmax)
    torch.testing.assert_close(rows.errors.d, d, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(rows.lse, lse, rtol=1e-13, atol=0.0)
    plain = row_pass(x, p.temperature, blocks, prefix)
    assert plain.errors is None
    assert torch.equal(plain.lse, rows.lse) and torch.equal(plain.logp, rows.logp)


def test_a_wrong_weighting_of_the_target_would_be_seen():
    """The target's term counts (1 - p_c): with p_c instead, d moves by far more than the comparison's rtol on
    the rows where the target is likely (a check that the dense formula above can tell them apart)."""
    x, p = _inputs("token-is", "odd-bf16", 2)
    u = UNIT_ROUNDOFF["bfloat16"]
    rows = row_pass(x, p.temperature, Blocks(5, 97), u=u)
    h, w, _ = flat(x)
    z = h.to(torch.float64) @ w.to(torch.float64).T
    e = u * z.abs() + math.sqrt(h.shape[1]) * FP32_U * h.to(torch.float64).norm(dim=-1)[:, None] * \
        w.to(torch.float64).norm(dim=-1)[None, :]
    naive = (torch.softmax(z / p.temperature, -1) * e).sum(-1)
    assert not torch.allclose(rows.errors.d, naive, rtol=1e-6, atol=0.0)


def test_a_nan_row_stays_in_its_row():
    x, p = _inputs("token-is", "odd-bf16", 1)
    x["hidden"].view(-1, x["hidden"].shape[-1])[4] = float("nan")
    rows = row_pass(x, p.temperature, Blocks(5, 97), u=UNIT_ROUNDOFF["bfloat16"])
    for t in (rows.lse, rows.errors.d, rows.errors.emax, rows.errors.zmax):
        bad = torch.isnan(t).nonzero().flatten().tolist()
        assert bad == [4]
