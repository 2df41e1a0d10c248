"""The batch-1 small-advantage catch (issue 27; docs/checks.md, "What a verdict covers", row 7), judged
in this process without a worker: call A of `batch1-seq1` (vocab 4099, bf16 logits, one scored row)
as the baseline probe generates it (the workload's first input set: a tiny |A| in [1e-3, 0.035]).

- tests/gallery/small-advantage-cutoff-b1 (the gradient of |A| < 0.04 zeroed) fails `gradient` on
  every draw and passes `loss`; implementations/pytorch passes both on the same draws;
- without the input rule that gives a small-|A| sequence a scored row that is not `peaked`
  (`inputs._resolvable_rows`), the cutoff passes a share of the same draws: a near one-hot row
  (p_t ~ 1 at the target) has a gradient s (1 - p_t) below every floor of the comparator whatever
  |A|, so no allowance could tell it from 0 without failing honest kernels there. That is why the
  catch is on the input side: the allowance already scales with the row (s_row is |A| / T times
  the row's weight), and a zeroed row of any other profile is outside it by orders of magnitude.
"""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.spec import find_spec
from in_process import judge, load_module

ROOT = Path(__file__).resolve().parent.parent
DRAWS = 30


CUTOFF = load_module(ROOT / "tests" / "gallery" / "small-advantage-cutoff-b1" / "impl.py", "small_adv_cutoff_b1")
PYTORCH = load_module(ROOT / "implementations" / "pytorch" / "impl.py", "small_adv_pytorch")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _call_a(seed: int) -> tuple[WorkloadConformance, dict]:
    """The run (its drawn parameters) and call A's inputs, as the baseline probe draws them."""
    spec = find_spec("grpo/token-is")
    rw = spec.resolve(spec.workload("batch1-seq1"), random.Random(0))
    r = random.Random(seed)
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw,
                              [r.getrandbits(62), r.getrandbits(62)], ())
    x = gen.generate(spec, rw, run.seeds[0], "cpu", values=run.model.values, case=0).tensors
    return run, x


def _judge(run: WorkloadConformance, x: dict, impl) -> tuple[bool, bool]:
    """(loss passed, gradient passed) of `impl` on `x`, the logits a leaf of the workload's dtype."""
    return judge(run, x, impl.grpo_loss)


def test_call_a_of_batch1_holds_a_small_advantage_below_the_cutoff():
    for seed in range(DRAWS):
        _, x = _call_a(seed)
        a = float(x["advantages"].abs().max())
        assert 1e-3 <= a <= 0.035 < 0.04, (seed, a)


def test_the_batch1_cutoff_fails_the_gradient_on_every_draw_and_pytorch_passes():
    for seed in range(DRAWS):
        run, x = _call_a(seed)
        assert _judge(run, x, CUTOFF) == (True, False), seed  # the loss is exact: only the gradient shows it
        assert _judge(run, x, PYTORCH) == (True, True), seed


def test_without_resolvable_rows_a_peaked_row_hides_the_cutoff(monkeypatch):
    """The rule is what catches it: without it the cutoff passes where the one row is drawn peaked."""
    monkeypatch.setattr(gen, "_resolvable_rows", lambda *args, **kwargs: None)
    monkeypatch.setattr(gen, "_unpeak", lambda *args, **kwargs: None)  # batch 1 x seq 1: its one id is special
    passed = 0
    for seed in range(DRAWS):
        run, x = _call_a(seed)
        passed += _judge(run, x, CUTOFF)[1]
    assert DRAWS // 5 <= passed < DRAWS, passed  # measured: about half (the row is peaked half the time)
