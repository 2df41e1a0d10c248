"""The generators per input kind (grpo_conform/ops/grpo_logits/generators): mask layouts and dtypes, far log-prob
gaps, and the float64 reference on what they produce (all-masked rows and batches, gaps of 25)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.ops.grpo_logits.generators import INPUT_KINDS, kind_of
from grpo_conform.ops.grpo_logits.generators.logprob_gaps import FAR_LOG, far_log_cap, far_ratio_inputs
from grpo_conform.ops.grpo_logits.generators.masks import EDGES, ORDINARY, UNTIMED, classify, draw_mask, row_layouts
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_logprobs, reference_loss
from grpo_conform.spec import load_member
from member_cases import FAMILY


def _member(name, workload="mask-small-bf16", **axes):
    spec = load_member(FAMILY, name)
    w = spec.workload(workload)
    if axes:
        w = w.model_copy(update={"axes": {**w.axes, **axes}})
    return spec, spec.resolve(w, random.Random(0))


def test_every_declared_input_has_a_kind():
    spec = load_member(FAMILY, "token-offpolicy-mask-kl")
    assert {kind_of(t.name) for t in spec.inputs} <= set(INPUT_KINDS.values())
    with pytest.raises(KeyError, match="INPUT_KINDS"):
        kind_of("hidden_states")


def test_classify_reads_the_layout_back():
    rows = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0],
                         [0, 1, 1, 0]], dtype=torch.bool)
    assert classify(rows) == ["right", "left", "holes", "single", "full", "empty", "holes"]


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 6, 8])
def test_every_layout_within_the_first_sets_of_a_workload(batch):
    wanted = set(UNTIMED) - ({"empty"} if batch == 1 else set())
    seen = set()
    for case in range(len(UNTIMED) if batch == 1 else 3):
        keep = draw_mask(batch, 12, case, False, 0.75, torch.Generator().manual_seed(case))
        assert keep.any(), case  # never a dead batch: the all-masked batch is a call of its own
        rows = classify(keep)
        seen |= set(rows)
        if batch >= 4:  # every set: a row of each kept count a normaliser can get wrong (0, 1, S)
            assert set(EDGES) <= set(rows), (case, rows)
        if batch >= 2:
            assert set(rows) & set(ORDINARY) and set(rows) & set(EDGES), (case, rows)
    assert wanted <= seen, wanted - seen
    assert "empty" not in row_layouts(1, 5, torch.Generator())


def test_short_rows_still_hold_something_and_say_what():
    for seq in (1, 2, 3):
        for case in range(6):
            keep = draw_mask(2, seq, case, False, 0.75, torch.Generator().manual_seed(seq * 7 + case))
            assert keep.any() and len(classify(keep)) == 2


def test_timed_masks_keep_the_fraction_and_pad_on_both_sides():
    g = torch.Generator().manual_seed(1)
    keep = torch.cat([draw_mask(8, 64, None, True, 0.75, g) for _ in range(20)])
    assert 0.65 < float(keep.float().mean()) < 0.85
    layouts = set(classify(keep))
    assert {"right", "left"} <= layouts and "holes" not in layouts


@pytest.mark.parametrize("dtype", ["bool", "int64", "int32"])
def test_masks_are_zero_one_in_every_declared_dtype(dtype):
    spec, rw = _member("token-offpolicy-mask")
    assert dtype in spec.input("completion_mask").dtypes
    rw.dtypes["completion_mask"] = dtype
    x = gen.generate(spec, rw, 5, "cpu", values=spec.parameter_values, case=0)
    m = x["completion_mask"]
    assert m.dtype == gen.torch_dtype(dtype) and set(m.flatten().tolist()) <= {0, 1}
    assert x.covered["mask_dtypes"] == [dtype] and len(x.covered["mask_layouts"]) >= 3


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask", "token-offpolicy-mask-kl"])
def test_far_gaps_reach_25_on_live_tokens_and_the_reference_stays_finite(member):
    spec, rw = _member(member)
    values = dict(spec.parameter_values)
    for seed in range(4):
        x = gen.generate(spec, rw, seed, "cpu", values=values, case=seed).tensors
        reach = {}
        fx = far_ratio_inputs(spec, x, values, seed, reach)
        lo, hi = reach["log_ratio"]
        assert hi >= FAR_LOG - 1.0 and lo <= -FAR_LOG + 1.0, reach  # beyond verl's clamp at +-20
        if "ref_logprobs" in fx:
            glo, ghi = reach["ref_gap"]
            assert ghi >= FAR_LOG - 1.0 and glo <= -FAR_LOG + 1.0, reach
        p = GrpoParameters.from_spec(spec, values)
        loss = reference_loss(fx, p)
        grad = reference_gradient_dense(fx, p)
        assert math.isfinite(loss) and torch.isfinite(grad).all()
        assert float(grad.abs().max()) > 1e6  # the far tokens carry e^gap, unclamped


def test_far_gaps_stay_inside_a_float16_gradient():
    spec, rw = _member("token-offpolicy-mask-kl", "mask-fp16")
    values = dict(spec.parameter_values)
    x = gen.generate(spec, rw, 3, "cpu", values=values, case=0).tensors
    reach = {}
    far_ratio_inputs(spec, x, values, 3, reach)
    cap = far_log_cap(torch.float16)
    assert cap < 8 and reach["log_ratio"][1] <= cap + 1e-3 and reach["ref_gap"][1] <= cap + 1e-3  # spans: 3 decimals
    assert reach["log_ratio"][0] <= -FAR_LOG + 1.0  # the shrinking side needs no cap


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "bnpo-mask", "dapo-mask", "sequence-offpolicy-mask",
                                    "token-offpolicy-mask-kl", "cispo-mask", "dr-grpo-mask"])
def test_the_reference_of_an_all_masked_batch_is_zero_and_finite(member):
    spec, rw = _member(member)
    values = dict(spec.parameter_values)
    x = gen.generate(spec, rw, 9, "cpu", values=values, case=0).tensors
    x["completion_mask"].zero_()
    p = GrpoParameters.from_spec(spec, values)
    assert reference_loss(x, p) == 0.0
    grad = reference_gradient_dense(x, p)
    assert torch.isfinite(grad).all() and not grad.any()
    assert torch.isfinite(reference_logprobs(x, p)).all()


@pytest.mark.slow
def test_a_masked_workload_records_what_its_inputs_covered():
    """End to end (pytorch, a small shape of batch 2): every mask layout, the all-masked batch, the three
    mask dtypes, small advantages, drawn special ids and far gaps are in the workload's draws."""
    from pathlib import Path

    from grpo_conform.checks.conformance import WorkloadConformance
    from grpo_conform.checks.probes import select
    from grpo_conform.implementations import load_implementation
    from grpo_conform.isolation.session import WorkerSession

    spec, rw = _member("token-offpolicy-mask-kl", batch=2, seq=6, vocab=97)
    root = Path(__file__).resolve().parent.parent
    session = WorkerSession(load_implementation(root / "implementations" / "pytorch"), spec.parameter_values,
                            torch.device("cpu"), 120.0, True)
    session.start()
    try:
        run = WorkloadConformance(session, spec, rw, [21, 22], select("full"))
        outcomes = {o.check: o for o in run.run()}
    finally:
        session.close()
    assert all(o.status in ("pass", "not_applicable") for o in outcomes.values()), \
        {k: o.message for k, o in outcomes.items() if o.status not in ("pass", "not_applicable")}
    d = run.draws
    assert {"right", "left", "holes", "single", "full", "empty", "all-masked batch"} <= set(d["mask_layouts"])
    assert d["mask_dtypes"] == ["bool", "int32", "int64"]
    assert {"tiny", "exact-tiny"} <= set(d["advantage_cases"])
    assert d["far_gaps"]["log_ratio"][1] >= 24 and d["far_gaps"]["ref_gap"][0] <= -24
    assert d["special_ids"] and "input_sets_without_special_ids" in d


@pytest.mark.parametrize("member", ["token-offpolicy-mask-kl", "sequence-offpolicy-mask", "cispo-mask"])
def test_the_chunked_reference_with_log_prob_bounds_stays_finite_on_far_gaps(member):
    """What `judge` runs: small chunks, every row's coefficient and its fp32 log-prob error bound."""
    from grpo_conform.ops.grpo_logits.reference import chunked_gradient, loss_logprob_error

    spec, rw = _member(member)
    values = dict(spec.parameter_values)
    x = far_ratio_inputs(spec, gen.generate(spec, rw, 2, "cpu", values=values, case=0).tensors, values, 2)
    p = GrpoParameters.from_spec(spec, values)
    err = torch.full(x["completion_ids"].shape, 1e-3, dtype=torch.float64)
    budget = 3 * rw.axes["vocab"] * 8 * 4  # a few rows per chunk
    dense = reference_gradient_dense(x, p).view(-1, rw.axes["vocab"])
    for chunk in chunked_gradient(x, p, budget, logp_error=err):
        for part in (chunk.values, chunk.scale, chunk.coef, chunk.coef_error):
            assert torch.isfinite(part).all()
        assert torch.equal(chunk.values, dense[chunk.start : chunk.stop])
    assert math.isfinite(loss_logprob_error(x, p, err))


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 16])
def test_a_timed_workloads_conformance_sets_hold_the_edge_rows_and_its_timing_sets_do_not(batch):
    """Conformance sets of a timed workload (a `case`): the anchors' padded rows, min(3, batch - 1) of them
    replaced by EDGES rows (all three from batch 4 on); timing's sets (no case) stay the anchors' configuration."""
    for case in range(3):
        keep = draw_mask(batch, 64, case, True, 0.75, torch.Generator().manual_seed(case))
        rows = classify(keep)
        if batch >= 4:
            assert set(EDGES) <= set(rows), (case, rows)
        assert sum(r in EDGES for r in rows) >= min(3, batch - 1), (case, rows)
        timing = classify(draw_mask(batch, 64, None, True, 0.75, torch.Generator().manual_seed(case)))
        assert not {"empty", "single"} & set(timing), timing  # 32-64 of 64 kept: padded or full, never an edge


def test_a_zero_advantage_never_sits_on_a_row_of_at_most_one_kept_token():
    """The two edge cases of a batch-4 set, drawn apart (masks.zero_apart): where a zero advantage met an
    empty or single-token row, that row's edge had no effect on the loss (gallery non-leaf-single-token-rows-halved
    was missed in 1 run of 7); the layouts stay the same multiset."""
    from grpo_conform.ops.grpo_logits.generators.advantages import SMALL_MAX
    from grpo_conform.ops.grpo_logits.generators.masks import zero_apart

    met = 0
    for case in range(12):
        gen = torch.Generator().manual_seed(case)
        keep = draw_mask(4, 12, case, False, 0.75, gen)
        adv = torch.tensor([0.5, -0.7, 0.0, 0.02])[torch.randperm(4, generator=gen)]
        met += int(keep[adv == 0].sum()) <= 1
        out = zero_apart(keep, adv)
        assert int(out[adv == 0].sum()) > 1, (case, keep, adv)
        assert any(int(out[j].sum()) > 1 and abs(float(adv[j])) > SMALL_MAX for j in range(4)), (case, out, adv)
        assert abs(float(adv[int(out.sum(-1).argmax())])) == float(adv.abs().max()), (case, out, adv)  # richest: largest
        assert sorted(classify(out)) == sorted(classify(keep))
    assert met  # the draws above met the case at least once (else the test shows nothing)


def test_audible_scalars_keep_a_zero_only_on_a_row_with_tokens():
    """The one call of a pattern (O, OF, IM, AC): a zero on the single-token row hid that row's bug (gallery
    autocast-single-token-rows-halved passed 4 runs in 40 with `-k loss`; 0 in 40 after)."""
    import types

    from grpo_conform.ops import operation_for
    from grpo_conform.ops.grpo_views import audible_scalars
    from grpo_conform.spec import find_spec

    spec = find_spec("grpo/token-offpolicy-mask")
    mask = torch.tensor([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.int64)
    adv = torch.tensor([0.0, 0.0, 0.0, -1e-4])
    slot = types.SimpleNamespace(pristine={"completion_mask": mask, "advantages": adv})
    out = audible_scalars(types.SimpleNamespace(op=operation_for(spec), spec=spec), slot)["advantages"]
    assert out.tolist() == [0.0, 0.25, 0.25, -0.25]
