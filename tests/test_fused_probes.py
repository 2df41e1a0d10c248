"""grpo-fused-linear's own probes (ops/fused_linear/probes.py, issue 31 item 3) without a worker: where
they apply, the tie's scale, and the two judgements in-process on eager bf16 autograd (the honest
accumulation and tie pass, an overwrite and a lost tie fail on every seed). The end-to-end runs are
the gallery's (`fused-grad-overwritten`, `fused-grad-assigned`) and the fused-torch peer's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import math

import torch

from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.probes import PROBES_BY_NAME, PROFILES
from grpo_conform.checks.registry import CONFORMANCE_CHECKS
from grpo_conform.checks.units import judge_units
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear.probes import (ACCUMULATION, FUSED_PROBES, NON_LEAF, TIED, odd_sizes,
                                                  tie_plan, tie_rows, tie_scale)
from grpo_conform.spec import find_spec, load_family

ROOT = Path(__file__).resolve().parent.parent
FAMILY = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")


def test_the_fused_probes_apply_to_every_fused_member_and_to_no_logits_spec():
    assert {ACCUMULATION, TIED} <= set(CONFORMANCE_CHECKS)
    for probe in FUSED_PROBES:
        assert PROBES_BY_NAME[probe.name] is probe and probe.name in PROFILES["full"]
        assert probe.name not in PROFILES["core"]  # a retained graph / an extra reference pass: full only
        for member in FAMILY.member_names:
            assert probe.applies(FAMILY.member(member)) is None, (probe.name, member)
        why = probe.applies(find_spec("grpo/token-is"))
        assert why and "weight" in why


def test_the_tie_scale_is_a_power_of_two_under_a_quarter_of_each_tied_row_s_scale_per_lookup():
    scales = torch.tensor([0.0, 3e-3, 5e-4, 1.0], dtype=torch.float64)
    counts = torch.tensor([0, 2, 1, 0])
    s = tie_scale(scales, counts)
    assert s == 2.0 ** -13  # min(3e-3 / 8, 5e-4 / 4) = 1.25e-4 -> 2^-13 = 1.22e-4
    assert s <= 1.25e-4 < 2 * s
    assert tie_scale(torch.zeros(4, dtype=torch.float64), counts) == 0.0
    flat = torch.ones(100, dtype=torch.float64)
    assert tie_rows(torch.arange(100).view(2, 50), flat) == list(range(64))
    flat[3], flat[5] = 1e-3, 2e-2  # within 64x of the largest (1.0): 5 kept, 3 left out
    assert tie_rows(torch.tensor([3, 5, 5, 7]), flat) == [5, 5, 7]
    assert tie_rows(torch.tensor([3, 5]), torch.zeros(100, dtype=torch.float64)) == []


def test_with_allowances_the_tie_is_4_allowances_on_each_kept_row_and_rounds_under_half_of_one():
    """CI 2026-12-03 (gallery fused-grad-assigned passed tied-weights): scales 0.2-3, allowances 0.005-0.44.
    One s for every row was infeasible (the loosest row needs s >= 1.8, the tightest rounds badly above
    0.6), and the fallback 1/8 of a scale hid in every row's allowance. The plan ties the rows one s fits."""
    scales = torch.tensor([0.2058, 0.2574, 0.6914, 0.3361, 1.029, 1.206, 1.504, 2.992, 0.0], dtype=torch.float64)
    allowed = torch.tensor([0.005133, 0.008852, 0.03204, 0.01075, 0.09861, 0.1413, 0.1859, 0.4448, 0.0],
                           dtype=torch.float64)
    counts = torch.tensor([1, 1, 1, 1, 1, 1, 2, 1, 0])
    s, kept = tie_plan(scales, counts, allowed)
    assert s == 2.0 ** round(math.log2(s)) and int(kept.sum()) >= 5 and not bool(kept[8])
    c = counts[kept].to(torch.float64)
    assert bool((s * c >= 4 * allowed[kept]).all())  # a lost term: 4 allowances or more
    assert bool(((scales[kept] + s * c) * 2.0 ** -8 <= allowed[kept] / 2).all())  # the sum's rounding
    assert s > tie_scale(scales, counts)  # the allowance-free rule's term, the one that hid
    s0, every = tie_plan(scales, counts)
    assert s0 == tie_scale(scales, counts) and torch.equal(every, counts > 0)
    # no row admits any s (allowances under the bf16 rounding of the term): every row, the plain rule
    s1, every = tie_plan(scales, counts, allowed * 1e-3)
    assert s1 == tie_scale(scales, counts) and torch.equal(every, counts > 0)


def test_a_cpu_workload_meets_every_block_boundary():
    """Issue 31 item 4: T and V (and the rows) not multiples of any power-of-two block, on the default CPU tier."""
    spec = FAMILY.member("token-is")
    cpu = [w for w in spec.workloads if "cpu" in w.devices and w.tier == "standard"]
    met = {name for w in cpu for name in odd_sizes(spec.resolve(w).axes)}
    assert {"odd rows", "odd seq", "odd vocab"} <= met, met
    assert odd_sizes({"batch": 2, "seq": 8, "hidden": 32, "vocab": 256}) == []


def _setup(seed: int, member: str = "token-is", workload: str = "odd-bf16"):
    spec = FAMILY.member(member)
    op = operation_for(spec)
    rw = spec.resolve(spec.workload(workload))
    model = ReferenceModel.drawn(spec, random.Random(seed))
    x = op.generate(spec, rw, seed, "cpu", values=model.values, case=seed).tensors
    return spec, op, rw, model, x


def _eager_graph(x, model, tie=None):
    """The fused-torch computation (bf16 F.linear, fp32 log-softmax, token-is) on fresh leaves;
    `tie` = (rows, s) adds s * embedding(rows, weight).sum() as the worker does."""
    leaves = {n: x[n].clone().requires_grad_(True) for n in ("hidden", "weight")}
    logits = torch.nn.functional.linear(leaves["hidden"], leaves["weight"]).float()
    T = model.values["temperature"]
    logp = torch.log_softmax(logits / T, -1).gather(-1, x["completion_ids"].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    loss = (-(ratio * x["advantages"].float().unsqueeze(-1))).mean(-1).mean()
    total = loss
    if tie is not None:
        rows, s = tie
        total = loss + s * torch.nn.functional.embedding(torch.tensor(rows), leaves["weight"]).sum()
    return loss, total, leaves


def _judge(spec, op, rw, model, x, loss, grads, c):
    dtype = rw.dtypes["hidden"]
    em = op.error_model(spec, x, model.params, dtype)
    info = torch.finfo(torch.bfloat16)
    _, cmps = judge_units(op, spec, rw, spec.tolerance(dtype), model.params, x, loss, grads, c, em,
                          op.gradient_groupings(spec), 2.0 * info.tiny * info.eps, model.loss(x))
    return cmps


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_accumulated_gradients_pass_and_an_overwrite_fails(seed):
    spec, op, rw, model, x = _setup(seed)
    c1, c2 = 0.6 + 0.3 * seed, 1.7 - 0.35 * seed
    loss, total, leaves = _eager_graph(x, model)
    total.backward(torch.tensor(c1), retain_graph=True)
    first = {n: t.grad.clone() for n, t in leaves.items()}
    total.backward(torch.tensor(c2))
    grads = {n: t.grad for n, t in leaves.items()}
    assert _judge(spec, op, rw, model, x, float(loss.detach()), grads, c1 + c2).passed
    overwritten = {n: g - first[n] for n, g in grads.items()}  # what the second backward alone gave
    assert not _judge(spec, op, rw, model, x, float(loss.detach()), overwritten, c1 + c2).passed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_tied_weight_passes_once_its_term_is_subtracted_and_a_lost_tie_fails(seed):
    spec, op, rw, model, x = _setup(seed)
    scales = torch.cat([ch.scale for ch in op.reference_gradients(spec, x, model.params)["weight"]])
    rows = tie_rows(x["completion_ids"], scales)
    counts = torch.bincount(torch.tensor(rows), minlength=x["weight"].shape[0])
    s = tie_scale(scales, counts)
    assert s > 0
    loss, total, leaves = _eager_graph(x, model, (rows, s))
    total.backward()
    tie = (s * counts.to(torch.float64))[:, None]
    grads = {"hidden": leaves["hidden"].grad, "weight": leaves["weight"].grad.to(torch.float64) - tie}
    assert _judge(spec, op, rw, model, x, float(loss.detach()), grads, 1.0).passed
    lost = dict(grads, weight=grads["weight"] - tie)  # the kernel's d weight alone, the embedding's lost
    assert not _judge(spec, op, rw, model, x, float(loss.detach()), lost, 1.0).passed


@pytest.mark.slow
def test_the_eager_peer_passes_the_fused_probes_with_a_bias_and_names_the_block_boundaries():
    """implementations/fused-torch (autograd all the way) through a worker: token-is-bias (bias.grad
    accumulated too) on odd-bf16, hidden also as a model output's slice; the record's coverage names the
    odd sizes."""
    from grpo_conform.check import CheckRequest, run_check

    report = run_check(CheckRequest((str(ROOT / "implementations" / "fused-torch"),), device="cpu",
                                    workloads=("odd-bf16",), members=("token-is-bias",),
                                    checks=(ACCUMULATION, TIED, NON_LEAF)))
    (impl,) = report.implementations
    (workload,) = impl.workloads
    outcomes = {o.check: o for o in workload.outcomes}
    assert all(outcomes[c].status == "pass" for c in (ACCUMULATION, TIED, NON_LEAF)), outcomes
    assert "model-output-slice" in workload.draws["call_patterns"]
    assert report.exit_code == 0
    assert {"odd rows", "odd seq", "odd vocab"} <= set(workload.draws["exercised"]["block_boundaries"])
    assert workload.draws["tied_weights"]["scale"] > 0


@pytest.mark.slow
def test_forward_only_of_an_off_policy_fused_member_takes_the_operation_s_reference_loss():
    """The no_grad call's reference loss came from the logits operation's log-probs (x["logits"]: a
    KeyError that ended `check implementations/fused-torch` at token-offpolicy-mask); it is the
    operation's own reference loss now (conformance.reference_loss)."""
    from grpo_conform.check import CheckRequest, run_check

    report = run_check(CheckRequest((str(ROOT / "implementations" / "fused-torch"),), device="cpu",
                                    workloads=("tiny-bf16",), members=("token-offpolicy-mask",),
                                    checks=("forward-only", "inference-mode")))
    (workload,) = report.implementations[0].workloads
    outcomes = {o.check: o for o in workload.outcomes}
    assert outcomes["forward-only"].status == "pass" and outcomes["inference-mode"].status == "pass", outcomes
