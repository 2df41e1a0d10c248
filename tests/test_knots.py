"""The mask-runs probe's sets keep every live ratio clear of the member's knots (generators/knots.py).

Its far moves (+-0.5 to 1.5 per token, ops/grpo_mask_runs.py) ignored them: in CI an honest pytorch failed
gradient at MR-2, one token 6e-6 from 1 + epsilon_high at a log-prob of -414, where float32 resolves 3e-5. Before
`clear_of_knots` 1 set in 300 of token-offpolicy-mask-delta failed so (tests/in_process-style sampling); after, 0
in 7,600 over every masked member. Every set below held a ratio inside a knot's margin before."""

from __future__ import annotations

import math
import random
import types
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.ops import grpo_mask_runs as M
from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.ops.grpo_logits.generators.knots import CLEAR, raise_out, ratio_knots
from grpo_conform.ops.grpo_logits.reference import reference_logprobs
from grpo_conform.spec import find_spec
from in_process import judge, load_module

ROOT = Path(__file__).resolve().parent.parent


def _mask_runs_set(member: str, s: int):
    """(run, tensors, keep, logp before the moves) of one MR-2-like call at a small vocabulary, drawn from `s`."""
    spec = find_spec(f"grpo/{member}")
    w = spec.workload("mask-small-bf16")
    r = random.Random(s * 7919 + 13)
    seq = r.randint(*M.SEQ)
    free = [a.name for a in spec.axes if a.derivation() is None]
    axes = {**{a: spec.resolve(w, random.Random(s)).axes[a] for a in free}, "batch": len(M.LAYOUTS), "seq": seq,
            "vocab": r.randint(*M.VOCAB_CPU)}
    rw = spec.resolve(w.model_copy(update={"axes": axes}), random.Random(s))
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw, [s * 31 + 1, s * 17 + 5], ())
    keep = torch.stack([M.run_row(name, seq, r) for name in r.sample(M.LAYOUTS, len(M.LAYOUTS))])
    x = gen.generate(spec, rw, s * 1000003 + 7, "cpu", values=run.model.values, given={"completion_mask": keep}).tensors
    before = {k: v.clone() for k, v in x.items()}
    M.far_ratios(run, types.SimpleNamespace(tensors=x, commit=lambda: None), keep, r)
    return run, x, keep, before


def test_raise_out_lifts_only_what_lies_inside_a_window_and_above_it():
    knots, margin = [0.8, 1.2], 0.02
    vals = torch.log(torch.tensor([0.5, 0.79, 0.8, 0.815, 1.0, 1.19, 1.2239, 1.3], dtype=torch.float64))
    out = torch.exp(raise_out(vals, knots, margin))
    for v, o in zip(torch.exp(vals).tolist(), out.tolist()):
        near = next((k for k in knots if abs(math.log(v / k)) < math.log1p(margin) * CLEAR), None)
        if near is None:
            assert o == pytest.approx(v, rel=1e-12)
        else:
            assert o > v and o == pytest.approx(near * (1 + margin) ** CLEAR, rel=1e-12)


@pytest.mark.parametrize("member,seed", [("token-offpolicy-mask-delta", 81), ("token-offpolicy-mask-delta", 3),
                                         ("cispo-mask", 4), ("sequence-offpolicy-mask", 5),
                                         ("luspo-sequence-mask", 6), ("dapo-mask", 7)])
def test_no_live_ratio_of_a_mask_runs_set_lies_within_the_margin_of_a_knot(member, seed):
    run, x, keep, _ = _mask_runs_set(member, seed)
    p, margin = run.model.params, run.spec.validation.member_inputs.boundary_margin
    log_r = reference_logprobs(x, p) - x["old_logprobs"].double()
    if p.importance_sampling_level == "sequence":  # a row's mean log-ratio: the moves keep it as drawn
        log_r = (torch.where(keep, log_r, 0.0).sum(-1) / keep.sum(-1))[keep.any(-1)]
    else:
        log_r = log_r[keep]
        assert (log_r.abs() > 0.3).float().mean() > 0.5  # still far moves: most token ratios beyond e^+-0.3
    for k in ratio_knots(p):
        assert (torch.abs(log_r - math.log(k)) > math.log1p(margin)).all(), k


@pytest.mark.parametrize("member", ["vllm-sequence-mask", "vllm-sequence-truncate"])
def test_every_row_keeps_its_sum_of_log_sampling_ratios(member):
    """An odd row's middle token is not moved: the sequence modes' product stays as drawn (it was moved by e^+-d,
    up to 4.5x, which could land it at the cap that the drawn sets keep clear)."""
    run, x, keep, before = _mask_runs_set(member, 9)
    assert (keep.sum(-1) % 2 == 1).any()
    total = lambda t: torch.where(keep, torch.log(t.double()), 0.0).sum(-1)
    moved = total(x["sampling_ratio"]) - total(before["sampling_ratio"])
    assert moved.abs().max() < 1e-4, moved


def test_honest_pytorch_passes_the_set_that_failed_in_ci():
    """The sampled set whose token sat 6e-6 from 1 + epsilon_high failed gradient before."""
    run, x, _, _ = _mask_runs_set("token-offpolicy-mask-delta", 81)
    pytorch = load_module(ROOT / "implementations" / "pytorch" / "impl.py", "knots_pytorch")
    assert judge(run, x, pytorch.grpo_loss) == (True, True)


def test_the_fused_operation_s_mask_runs_sets_are_cleared_from_its_own_log_probs():
    """On CUDA mask-runs also runs on grpo-fused-linear, whose log-probs come from hidden @ weight
    (`Operation.policy_logprobs`): the same clearing, driven here on the CPU at a small shape."""
    from grpo_conform.spec.family import load_family

    spec = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json").member("token-offpolicy-mask")
    w = spec.workloads[0]
    axes = {**spec.resolve(w, random.Random(1)).axes, "batch": len(M.LAYOUTS), "seq": 40}
    axes = {a.name: axes[a.name] for a in spec.axes if a.derivation() is None}
    rw = spec.resolve(w.model_copy(update={"axes": axes}), random.Random(1))
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw, [11, 12], ())
    r = random.Random(5)
    keep = torch.rand(len(M.LAYOUTS), 40, generator=torch.Generator().manual_seed(5)) > 0.2
    x = run.op.generate(spec, rw, 99, "cpu", values=run.model.values, given={"completion_mask": keep}).tensors
    assert M.far_ratios(run, types.SimpleNamespace(tensors=x, commit=lambda: None), keep, r)
    p, margin = run.model.params, spec.validation.member_inputs.boundary_margin
    log_r = (run.op.policy_logprobs(spec, x, p) - x["old_logprobs"].double())[keep]
    for k in ratio_knots(p):
        assert (torch.abs(log_r - math.log(k)) > math.log1p(margin)).all(), k
