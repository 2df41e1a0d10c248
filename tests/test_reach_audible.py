"""Reach's calls are audible on every row (`grpo_views.audible_call`): drawn as the ordinary sets are, a sequence-level
member's rows call (two sequences of 1089+ rows) put the first sequence of each advantage sign where the clip binds
and could give the other |A| ~ 0, so its gradient was 0 to 1e-6 in most draws and any long-row bug matched the
reference (docs/checks.md, "Forty-sixth session"). Drawn here as reach draws the fused rows call, without a worker;
the honest eager fused implementation gives the gradient."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import torch

from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.reach import _generated_logp, reach_mask
from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_views import audible_call
from grpo_conform.spec import load_family
from in_process import load_module

ROOT = Path(__file__).resolve().parent.parent
SPEC = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json").member("sequence-offpolicy-mask")
EAGER = load_module(ROOT / "implementations" / "fused-torch" / "impl.py", "fused_torch_audible")
DRAWS = 8
LOUD = 1e-5  # a sequence's largest |d hidden|: audible, at least 1.0e-4 in these draws; as drawn, one sequence of every
# draw at 0 to 2.4e-7 and the whole call under 8.3e-6 in 5 of the 8


def _rows_call(seed: int, audible: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, each sequence's largest |d hidden|) of one rows-call draw in float32."""
    w = SPEC.workload("tiny-bf16")
    axes = {"batch": 2, "seq": 1089 + 2 * (seed % 4), "hidden": 12 + seed % 9, "vocab": 33 + seed % 13}
    dtypes = {**w.dtypes, "hidden": "float32", "weight": "float32"}
    rw = SPEC.resolve(w.model_copy(update={"axes": axes, "dtypes": dtypes}))
    op, model = operation_for(SPEC), ReferenceModel.drawn(SPEC, random.Random(seed))
    keep = reach_mask((2, axes["seq"]), torch.float32, 1000 + seed, False)
    x = op.generate(SPEC, rw, 77 + seed, torch.device("cpu"), values=model.values, given={"completion_mask": keep})
    t = dict(x.tensors)
    if audible:
        run = SimpleNamespace(spec=SPEC, op=op, model=model)
        audible_call(run, t, _generated_logp(x), 77 + seed)
    hidden = t["hidden"].detach().clone().requires_grad_(True)
    values = model.values
    loss = EAGER.fused_grpo_loss(hidden, t["weight"], t["completion_ids"], t["advantages"],
                                 epsilon_low=values["epsilon_low"], epsilon_high=values["epsilon_high"],
                                 temperature=values["temperature"], old_logprobs=t["old_logprobs"],
                                 completion_mask=t["completion_mask"], loss_type=values.get("loss_type", "grpo"),
                                 importance_sampling_level="sequence")
    (g,) = torch.autograd.grad(loss, hidden)
    return t["advantages"], g.abs().amax(dim=(1, 2))


def test_every_sequence_of_an_audible_rows_call_has_a_gradient_and_the_drawn_ones_did_not():
    drawn = [_rows_call(seed, audible=False)[1] for seed in range(DRAWS)]
    assert all(float(loud.min()) < LOUD for loud in drawn)  # the finding: as drawn, a silent sequence in every draw
    assert sum(float(loud.max()) < LOUD for loud in drawn) >= DRAWS // 2  # and whole calls without a gradient
    for seed in range(DRAWS):
        adv, loud = _rows_call(seed, audible=True)
        assert float(adv.abs().min()) >= 0.25, (seed, adv)
        assert float(loud.min()) > LOUD, (seed, loud)  # each sequence, not only the call
