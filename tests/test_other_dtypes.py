"""The twenty-ninth session's `other-dtypes` probe and float16 loss scale on their own (checks/other_dtypes.py,
checks/upstreams.py). The gallery folders other-dtypes-fp16-tie-to-clipped, other-dtypes-fp16-loss-scale and
fused-other-dtypes-fp16-lse-no-max fail through them, fused-gradients-formed-in-forward passes
(tests/test_gallery.py)."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.checks.other_dtypes import smallest_workload
from grpo_conform.checks.probes import PROBES_BY_NAME, select
from grpo_conform.checks.member_calls import unused_dtypes
from grpo_conform.checks.upstreams import FP16_HEADROOM, FP16_LOSS_SCALE, draw_upstream
from grpo_conform.ops import operation_for
from grpo_conform.spec import find_spec


def _run(spec_id: str, grad_dtype: str = "bfloat16"):
    spec = find_spec(spec_id)
    return SimpleNamespace(spec=spec, rng=random.Random(3), device=torch.device("cpu"), grad_dtype=grad_dtype,
                           draws={}, rw=None)


def test_the_unused_dtypes_and_the_smallest_workload_come_from_the_spec():
    masked = _run("grpo/dapo-mask")  # default CPU workloads: bfloat16 only
    assert unused_dtypes(masked.spec, "cpu") == ["float16", "float32"]
    small = smallest_workload(masked)
    sizes = [w.axes["batch"] * w.axes["seq"] * w.axes["vocab"] for w in masked.spec.workloads_for("cpu")]
    assert small.axes["batch"] * small.axes["seq"] * small.axes["vocab"] == min(sizes)
    assert unused_dtypes(find_spec("grpo/token-is"), "cpu") == []  # fp16-small and fp32-small are default workloads
    assert unused_dtypes(find_spec("grpo-fused-linear/token-is"), "cpu") == ["float16", "float32"]


def test_the_probe_repeats_the_value_probes_and_k_keeps_it():
    other = PROBES_BY_NAME["other-dtypes"]
    for name in ("exact-ties", "far-ratios", "adversarial", "upstream"):
        assert set(PROBES_BY_NAME[name].feeds) <= set(other.feeds), name
    assert "other-dtypes" in [p.name for p in select("full", ("exact-ties",))]
    assert "other-dtypes" not in [p.name for p in select("full", ("determinism",))]
    assert "other-dtypes" not in [p.name for p in select("core")]


@pytest.mark.parametrize("bound, want", [(1e-3, FP16_LOSS_SCALE), (0.1, 2.0**15), (3.0, 2.0**10), (1e5, 1.0)])
def test_the_float16_loss_scale_is_the_largest_power_of_two_that_keeps_the_gradient_in_range(bound, want):
    run = _run("grpo/dapo-mask", "float16")
    c = draw_upstream(run, "large", bound=bound)
    assert c == want and (c * bound <= FP16_HEADROOM or c == 1.0)
    assert run.draws["upstream"]["large"] == c
    plain = draw_upstream(_run("grpo/dapo-mask", "float16"), "large")  # no bound: the ordinary 64..512
    assert 64.0 <= plain <= 512.0
    assert 64.0 <= draw_upstream(_run("grpo/dapo-mask", "bfloat16"), "large", bound=bound) <= 4096.0


def test_only_the_operation_whose_gradient_is_formed_in_backward_is_loss_scaled():
    assert operation_for(find_spec("grpo/dapo-mask")).loss_scaled
    assert not operation_for(find_spec("grpo-fused-linear/dapo-mask")).loss_scaled


def test_the_pass_runs_each_unused_dtype_once_with_its_own_labels_and_draws():
    """pytorch through the validator: the float16 and float32 calls are made (labels start with the dtype),
    once per worker and member, their draws apart; the workload's own draws are left as they were."""
    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                    members=("dapo-mask",), checks=("exact-ties", "upstream-gradient"), jobs=1))
    assert report.exit_code == 0
    workloads = report.implementations[0].members[0].workloads
    passes = [w.draws["other_dtypes"] for w in workloads if "other_dtypes" in w.draws]
    assert len(passes) == 1 and set(passes[0]) == {"float16", "float32"}
    f16 = passes[0]["float16"]
    assert f16["upstream"]["large"] == 2.0 ** round(math.log2(f16["upstream"]["large"]))  # a loss scale
    assert 64 <= passes[0]["float32"]["upstream"]["large"] <= 4096
    labels = [c for w in workloads for o in w.outcomes if o.check == "exact-ties" for c in json.dumps(o.evidence)
              .split('"') if c.startswith(("float16:", "float32:"))]
    assert any(lab.startswith("float16:T#") for lab in labels) and any(lab.startswith("float32:T#") for lab in labels)
    first = next(w for w in workloads if "other_dtypes" in w.draws)
    assert first.draws["upstream"]["large"] != f16["upstream"]["large"]  # the workload's own draw kept


@pytest.mark.parametrize("seed", range(4))
def test_the_sampling_product_swings_out_of_float32_and_back_keeping_each_sequence_weight(seed):
    """W-vllm (far-ratios, vLLM sequence modes): each row with 4 kept tokens or more keeps exp(sum of log
    ratios) but its partial log-sum reaches +-112, past float32's e^-103 and e^88.7; masked tokens and shorter
    rows unchanged (logprob_gaps.sampling_product_inputs)."""
    from grpo_conform.ops.grpo_logits.generators.logprob_gaps import SAMPLING_SWING, sampling_product_inputs

    spec = find_spec("grpo/vllm-sequence-mask")
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(3, 9, generator=g) < 0.7
    keep[0, :] = True
    keep[2, :] = False
    keep[2, :3] = True  # three kept: left as drawn
    x = {"completion_ids": torch.zeros(3, 9, dtype=torch.int64), "completion_mask": keep.to(torch.int64),
         "sampling_ratio": torch.exp(torch.randn(3, 9, generator=g) * 0.3)}
    values = {"vllm_importance_sampling_mode": "sequence_mask"}
    covered: dict = {}
    out = sampling_product_inputs(spec, x, values, seed, covered)
    log_before = torch.log(x["sampling_ratio"].double())
    log_after = torch.log(out["sampling_ratio"].double())
    for b in range(3):
        idx = keep[b].nonzero().flatten()
        if idx.numel() < 4:
            assert torch.equal(out["sampling_ratio"][b], x["sampling_ratio"][b])
            continue
        assert abs(float(log_after[b, idx].sum() - log_before[b, idx].sum())) < 1e-3  # q_b kept
        partial = torch.cumsum(log_after[b, idx], 0)
        assert float(partial.abs().max()) >= SAMPLING_SWING - 1.0  # out of float32's range part way
        assert torch.isfinite(out["sampling_ratio"][b]).all() and (out["sampling_ratio"][b] > 0).all()
        assert torch.equal(out["sampling_ratio"][b, ~keep[b]], x["sampling_ratio"][b, ~keep[b]])
    assert covered["rows"] == sum(int(keep[b].sum()) >= 4 for b in range(3))
    token = sampling_product_inputs(find_spec("grpo/vllm-token-mask"), x, {"vllm_importance_sampling_mode": "token_mask"},
                                    seed)
    assert torch.equal(token["sampling_ratio"], x["sampling_ratio"])  # token modes: nothing to swing


def test_the_pass_shape_is_drawn_around_the_smallest_workload_and_moves_with_the_secret(monkeypatch):
    """A fixed shape in float16 could be recognised (a kernel right at 4 x 12 x 1536 alone); the pass draws each
    axis in [v, 3v/2] per member from the process's secret (member_calls.drawn_axes), the shape compile-ahead
    compiled (member_calls.other_dtype_workloads)."""
    from grpo_conform.checks import member_calls
    from grpo_conform.checks.other_dtypes import drawn_axes

    run = _run("grpo/dapo-mask")
    w = smallest_workload(run)
    shapes = set()
    for secret in range(12):
        monkeypatch.setattr(member_calls, "SECRET", secret)
        axes = drawn_axes(run, w, "float16")
        assert all(w.axes[a] <= v <= w.axes[a] + w.axes[a] // 2 for a, v in axes.items())
        assert axes == drawn_axes(run, w, "float16")  # the same secret, the same shape
        planned = dict(member_calls.other_dtype_workloads(run.spec, run.device.type))
        assert planned["float16"].axes == axes and planned["float16"].dtypes["logits"] == "float16"
        shapes.add(tuple(axes.values()))
    assert len(shapes) > 6
