"""A small-|A| sequence is judged on a kept token that carries a gradient (generators/judged_rows.py and
inputs._resolvable_rows), judged in this process without a worker: call A of `mask-b1-long` (batch 1, 72
positions, a tiny advantage, right-padded) as the baseline probe draws it.

The seeds are draws on which tests/gallery/batch-one-shortcut (the advantage replaced by its sign at batch 1)
passed `gradient` before the fix: two kept tokens, one clipped and the other near one-hot (the first four), or
both near one-hot (the last two). 11 of 3,000 call-A draws passed it before, 0 of 20,000 after."""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.ops.grpo_logits.generators.judged_rows import AUDIBLE_GAP, middle_band
from grpo_conform.ops.grpo_logits.member_inputs import ratio_intervals
from grpo_conform.ops.grpo_logits.reference import GrpoParameters
from grpo_conform.spec import find_spec
from in_process import judge, load_module

ROOT = Path(__file__).resolve().parent.parent
HIDING = [(1562258775266490317, 2573747441449230842), (3734906243004017112, 4003741738209954596),
          (318892251176255292, 2913428223316290738), (3166622722145930372, 3583223311187009233),
          (3732012220053183931, 3121984121001252857), (957928858780490309, 78565654030721351)]


SHORTCUT = load_module(ROOT / "tests" / "gallery" / "batch-one-shortcut" / "impl.py", "batch_one_shortcut")
PYTORCH = load_module(ROOT / "implementations" / "pytorch" / "impl.py", "judged_rows_pytorch")


def _call_a(seeds: tuple[int, int]) -> tuple[WorkloadConformance, dict]:
    spec = find_spec("grpo/token-offpolicy-mask")
    rw = spec.resolve(spec.workload("mask-b1-long"), random.Random(0))
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw, list(seeds), ())
    return run, gen.generate(spec, rw, run.seeds[0], "cpu", values=run.model.values, case=0).tensors


@pytest.mark.parametrize("seeds", HIDING, ids=range(len(HIDING)))
def test_call_a_of_batch_one_holds_a_judged_token_and_the_shortcut_fails(seeds):
    run, x = _call_a(seeds)
    p = GrpoParameters.from_spec(run.spec, run.model.values)
    lo, hi = ratio_intervals(p, run.spec.validation.member_inputs)[middle_band(
        ratio_intervals(p, run.spec.validation.member_inputs))]
    keep = x["completion_mask"][0].bool()
    logp = torch.log_softmax(x["logits"][0, :-1].double() / p.temperature, -1).gather(
        -1, x["completion_ids"][0].long()[:, None]).squeeze(-1)
    r = torch.exp(logp - x["old_logprobs"][0].double())
    judged = keep & (-torch.expm1(logp) >= AUDIBLE_GAP) & (r >= lo * (1 - 1e-6)) & (r <= hi * (1 + 1e-6))
    assert bool(judged.any()), (r[keep], logp[keep])
    assert judge(run, x, SHORTCUT.grpo_loss) == (False, False)
    assert judge(run, x, PYTORCH.grpo_loss) == (True, True)
