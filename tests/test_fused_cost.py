"""The fused check's reference cost, counted (docs/fused-kernel.md, "Check time"): the float64 GEMM passes
over [N rows, V vocabulary] (2NHV FLOPs each, `memo.COUNTS` by kind) that one input set costs, never
repeated for the same inputs; the memo forgets an input set whose tensors change; the timed refresh
keeps every row's logits. Counts, not wall time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.model import ReferenceModel
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear import memo
from grpo_conform.ops.fused_linear.reference import generated_row_stats, logprobs_and_lse
from grpo_conform.spec import load_family

ROOT = Path(__file__).resolve().parent.parent
FAMILY = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")


def _setup(member: str, seed: int = 5, workload: str = "odd-bf16"):
    spec = FAMILY.member(member)
    op = operation_for(spec)
    rw = spec.resolve(spec.workload(workload))
    model = ReferenceModel.drawn(spec, random.Random(seed))
    x = op.generate(spec, rw, seed, "cpu", values=model.values, case=seed).tensors
    return spec, op, rw, model, x


def _judgment(spec, op, rw, model, x) -> None:
    """What the engine asks of the reference to judge one call: the error model, the loss and every
    gradient, in the order `checks/units.judge_units` reads them."""
    op.error_model(spec, x, model.params, rw.dtypes["hidden"])
    op.reference_loss(spec, x, model.params)
    for chunks in op.reference_gradients(spec, x, model.params).values():
        for _ in chunks:
            pass


def _passes(x) -> dict[str, float]:
    """memo.COUNTS in GEMM passes over the whole [N, V] (2NHV FLOPs each)."""
    n = x["hidden"].numel() // x["hidden"].shape[-1]
    v, h = x["weight"].shape
    return {k: f / (2 * n * h * v) for k, f in memo.COUNTS.items()}


@pytest.mark.parametrize("member, logits_sets", [("token-is-bias", 1), ("token-offpolicy-mask-kl-ref-weight", 2)])
def test_judging_one_input_set_twice_pays_the_row_pass_once(member, logits_sets):
    """The row pass (per lm_head: 2 with a reference weight) makes the log-sum-exp and the error model's row
    errors together (row_pass.py), and per judgment one sweep of three passes for every gradient (d logits,
    d weight, d hidden) also makes the error model's unit sums: 4 passes for a fresh input set. Before the
    twenty-second session the row errors were a pass of their own (5); before the memo, 9 a judgment."""
    spec, op, rw, model, x = _setup(member)
    memo.clear()
    memo.reset_counts()
    _judgment(spec, op, rw, model, x)
    _judgment(spec, op, rw, model, x)
    # the unit sums come from the first sweep's probabilities (tolerance.UnitSums): no pass of their own
    assert _passes(x) == pytest.approx({"lse": logits_sets, "d-logits": 2, "d-weight": 2, "d-hidden": 2})


def test_an_error_model_for_another_dtype_pays_its_row_errors_once():
    """The row pass makes the statistics for the operands' own roundoff; another dtype's error model (no
    engine path asks for one today) gets a pass of its own, kept like the rest."""
    spec, op, rw, model, x = _setup("token-is")
    assert rw.dtypes["hidden"] == "bfloat16"
    memo.clear()
    memo.reset_counts()
    own = op.error_model(spec, x, model.params, "bfloat16")
    assert "row-errors" not in memo.COUNTS
    other = op.error_model(spec, x, model.params, "float16")
    op.error_model(spec, x, model.params, "float16")
    assert _passes(x) == pytest.approx({"lse": 1, "row-errors": 1})
    assert other.max_logit_error < own.max_logit_error  # a smaller roundoff: a tighter bound


def test_a_changed_input_set_is_computed_again_and_the_generator_never_memoises():
    spec, op, rw, model, x = _setup("token-is")
    memo.clear()
    memo.reset_counts()
    first = logprobs_and_lse(x, model.params)
    assert logprobs_and_lse(x, model.params)[1] is first[1]  # the same input set: kept
    x["hidden"].copy_(x["hidden"].flip(0))  # an in-place write, as InputSlot.commit makes
    again = logprobs_and_lse(x, model.params)
    assert again[1] is not first[1]
    assert torch.equal(again[0], generated_row_stats(x, model.params).logp)
    assert _passes(x)["lse"] == pytest.approx(3)  # first, after the write, and the uncached one
    other = {k: v.clone() for k, v in x.items()}  # the same values in other tensors: a new entry
    assert logprobs_and_lse(other, model.params)[1] is not again[1]


def test_a_loss_only_use_makes_no_unit_sums_and_a_gradient_read_first_makes_them_alone():
    """Forward-only calls read the error model's loss allowance only; units read before any sweep are
    made on their own (one pass), equal to the ones a sweep makes."""
    spec, op, rw, model, x = _setup("token-is-bias")
    dtype = rw.dtypes["hidden"]
    memo.clear()
    memo.reset_counts()
    em = op.error_model(spec, x, model.params, dtype)
    assert em.loss >= 0.0 and "unit-sums" not in memo.COUNTS
    alone = {n: em.units[n].clone() for n in ("hidden", "weight", "bias")}
    assert _passes(x)["unit-sums"] == pytest.approx(1)
    memo.clear()
    swept = op.error_model(spec, x, model.params, dtype)
    for chunks in op.reference_gradients(spec, x, model.params).values():
        for _ in chunks:
            pass
    assert _passes(x)["unit-sums"] == pytest.approx(1)  # no second pass: the sweep made them
    for n, t in alone.items():
        assert torch.equal(swept.units[n], t), n


@pytest.mark.parametrize("member", ["token-offpolicy-mask-kl-ref-weight", "token-is-bias"])
def test_a_judged_input_set_dies_with_its_last_holder_and_takes_its_memo_along(member):
    """The memo holds input sets weakly; its error model's unit sums once held them strongly (for a later
    read), so every judged set stayed alive in the parent, up to memo.LIMIT sets of weights: on the H200
    4.1-6.3 GiB after a reference-weight workload, past the leak limit, which stopped the run."""
    import gc
    import weakref

    spec, op, rw, model, x = _setup(member)
    memo.clear()
    _judgment(spec, op, rw, model, x)
    names = [k for k, v in x.items() if isinstance(v, torch.Tensor)]
    refs = [weakref.ref(x[k]) for k in names]
    assert len(memo._entries) >= 1
    del x
    gc.collect()
    assert [n for n, r in zip(names, refs) if r() is not None] == []
    assert len(memo._entries) == 0
    # an error model whose unit sums were never made, kept past its input set: its first read says so
    spec, op, rw, model, x = _setup(member, seed=6)
    em = op.error_model(spec, x, model.params, rw.dtypes["hidden"])
    del x
    gc.collect()
    with pytest.raises(RuntimeError, match="input set is gone"):
        em.units["weight"]


def test_the_reference_gradients_are_bitwise_those_of_the_standalone_loops():
    """The one sweep (weight first) against each gradient asked for alone (hidden first: the standalone loops)."""
    from grpo_conform.ops.fused_linear.reference import Blocks, reference_gradients

    spec, op, rw, model, x = _setup("token-is-bias")
    for blocks in (None, Blocks(5, 97), Blocks(64, 7)):
        swept = {n: list(c) for n, c in reference_gradients(x, model.params, blocks).items()}
        grads = reference_gradients(x, model.params, blocks)
        alone = {n: list(grads[n]) for n in ("hidden", "bias", "weight")}
        for name in alone:
            for a, b in zip(swept[name], alone[name], strict=True):
                assert (a.start, a.stop) == (b.start, b.stop)
                assert torch.equal(a.values, b.values) and torch.equal(a.scale, b.scale), name


@pytest.mark.parametrize("member", ["token-is", "token-offpolicy-mask-kl"])
def test_an_engine_judging_one_input_set_twice_computes_its_reference_once(member):
    """retained-graph judges two calls on one input set (two upstream scalars): one row pass for both (the
    log-sum-exp and the row errors), one gradient sweep for each, the first making the unit sums (it was
    2 x 9 passes, then 8 until the row errors joined the row pass). A member that draws old or reference
    log-probs from the float64 log-probs pays no second row pass: the generator's, made of the pristine
    copies it drew into, is kept (it was 2 row passes)."""
    from grpo_conform.check import CheckRequest, run_check

    memo.clear()
    memo.reset_counts()
    report = run_check(CheckRequest((str(ROOT / "implementations" / "fused-torch"),), device="cpu",
                                    workloads=("tiny-bf16",), members=(member,), checks=("retained-graph",)))
    (impl,) = report.implementations
    (workload,) = impl.workloads
    assert {o.check: o.status for o in workload.outcomes}["retained-graph"] == "pass"
    b, t, h, v = 2, 8, 32, 257  # tiny-bf16
    passes = {k: f / (2 * b * t * h * v) for k, f in memo.COUNTS.items()}
    assert passes == pytest.approx({"lse": 1, "d-logits": 2, "d-weight": 2, "d-hidden": 2})


@pytest.mark.parametrize("member", ["token-is-bias", "token-offpolicy-mask-kl-ref-weight"])
def test_the_timed_refresh_moves_every_weight_byte_and_every_row_s_log_sum_exp(member):
    """Without the rows' scaling (rotation and permutation alone) every row's log-sum-exp would stay: a
    cache of it, keyed by a row's values up to order, would answer a forward without the logits GEMM."""
    spec, op, rw, model, x = _setup(member)
    before = {k: v.clone() for k, v in x.items()}
    p = model.params
    lse = generated_row_stats(before, p).lse
    op.refresh(x, random.Random(3))
    for name in ("hidden", "weight", "completion_ids", "advantages"):
        assert not torch.equal(x[name], before[name]), name
    assert (x["weight"] != before["weight"]).float().mean() > 0.95  # equal bf16 values may meet, rows do not
    assert torch.equal(torch.sign(x["advantages"]), torch.sign(before["advantages"]))
    for name in ("completion_mask", "old_logprobs", "ref_logprobs"):
        if name in x:
            assert torch.equal(x[name], before[name]), name
    rows = generated_row_stats(x, p)
    logp, lse_after = rows.logp, rows.lse
    assert bool(((lse_after - lse).abs() > 1e-6).all())
    assert bool(torch.isfinite(logp).all())
    norm = lambda t: t.float().norm(dim=-1)  # noqa: E731
    ratio = norm(x["hidden"]) / norm(before["hidden"])
    assert bool(((ratio > 0.89) & (ratio < 1.12)).all())


def test_timed_refreshes_of_the_fused_operation_draw_each_set_once_a_protocol(monkeypatch):
    """timed._refresh with grpo-fused-linear: a slot's first fill is a full generation, later ones the
    in-place refresh (75 weight draws a timed workload become 5: tests/test_fused_draws.py counts the three
    protocols); the pristine copy follows and the reference of a refreshed set is computed afresh (the memo
    key moves with the commit)."""
    from grpo_conform.checks import timed
    from grpo_conform.checks.buffers import InputSlot
    from grpo_conform.dtypes import torch_dtype
    from grpo_conform.phases import PHASES

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    spec, op, rw, model, _ = _setup("token-is", workload="tiny-bf16")
    t = timed.WorkloadTiming.__new__(timed.WorkloadTiming)
    t.spec, t.rw, t.op, t.device, t.rng = spec, rw, op, torch.device("cpu"), random.Random(1)
    t.mask_low, t.set_masks, t._filled = None, {}, set()
    tensors = {x.name: torch.empty(rw.shapes[x.name], dtype=torch_dtype(rw.dtypes.get(x.name, x.dtypes[0])))
               for x in spec.inputs}
    s = InputSlot("T0", tensors, {k: torch.empty_like(v) for k, v in tensors.items()})
    PHASES.reset()
    t._refresh([s])
    first = op.reference_loss(spec, s.pristine, model.params)
    weight = s.pristine["weight"].clone()
    t._refresh([s])
    assert PHASES.counts["inputs-generated"] == 1 and PHASES.counts["inputs-refreshed"] == 1
    assert not torch.equal(weight, s.pristine["weight"]) and torch.equal(s.tensors["weight"], s.pristine["weight"])
    fresh = {k: v.clone() for k, v in s.pristine.items()}  # other tensors: never memoised together
    assert op.reference_loss(spec, s.pristine, model.params) == op.reference_loss(spec, fresh, model.params) != first
