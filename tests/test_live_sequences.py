"""A sequence-level call's gradient is judged on a sequence whose ratio is not clipped (generators/judged_rows.py,
`free_one_sequence`), in this process without a worker.

Each advantage sign's first sequence sits where that sign's clip binds (`member_inputs.draw_signed_log_ratios`);
where that was every judged sequence of a set (batch 1, a drawn batch of 2) the gradient was exactly 0 for an honest
kernel and a wrong one alike: tests/gallery/sequence-batch-one-shortcut (GSPO, the advantage replaced by its sign at
batch 1) passed `gradient` on call A of mask-b1-long in 200 of 200 draws. Call A's sequence is now unclipped; the
set after it (forward-only's) keeps the clip bound, so batch 1 still meets the clipped branch."""

from __future__ import annotations

import math
import random
import types

import pytest
import torch

from conftest import GALLERY
from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.ops.grpo_logits.reference import GrpoParameters
from in_process import judge
from member_cases import load_impl, member_names, member_spec

SEQUENCE_MEMBERS = [m for m in member_names() if GrpoParameters.from_spec(member_spec(m)).importance_sampling_level
                    == "sequence"]
DRAWS = 40  # call-A draws per member: every one of them bound the clip before


def _set(member: str, seed: int, case: int) -> tuple[WorkloadConformance, dict]:
    spec = member_spec(member)
    rw = spec.resolve(spec.workload("mask-b1-long"), random.Random(seed))
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw, [seed, seed + 1], ())
    return run, gen.generate(spec, rw, run.seeds[0], "cpu", values=run.model.values, case=case).tensors


def _clipped(run: WorkloadConformance, x: dict) -> bool:
    """Whether the batch-1 sequence's ratio is where the clip binds for its advantage's sign."""
    p = GrpoParameters.from_spec(run.spec, run.model.values)
    keep = (x["completion_mask"][0] != 0).double()
    logp = torch.log_softmax(x["logits"][0, :-1].double() / p.temperature, -1).gather(
        -1, x["completion_ids"][0].long()[:, None]).squeeze(-1)
    s = math.exp(float(((logp - x["old_logprobs"][0].double()) * keep).sum() / keep.sum().clamp(min=1.0)))
    a = float(x["advantages"][0])
    return (a > 0 and s > 1 + p.epsilon_high) or (a < 0 and s < 1 - p.epsilon_low)


def test_there_are_sequence_level_members():
    assert {"sequence-offpolicy-mask", "luspo-sequence-mask"} <= set(SEQUENCE_MEMBERS)


@pytest.mark.parametrize("member", SEQUENCE_MEMBERS)
def test_call_a_of_batch_one_is_unclipped_and_the_next_set_binds(member):
    for seed in range(DRAWS):
        run, x = _set(member, seed, 0)
        assert not _clipped(run, x), (member, seed)
    for seed in range(DRAWS // 4):  # forward-only's set: the clipped branch keeps its batch-1 calls
        run, x = _set(member, seed, 1)
        assert _clipped(run, x), (member, seed)


def test_the_batch_one_shortcut_fails_call_a_and_the_honest_loss_passes():
    wrong = load_impl(GALLERY / "sequence-batch-one-shortcut")
    honest = load_impl(GALLERY.parent.parent / "implementations" / "pytorch")
    for seed in range(4):
        run, x = _set("sequence-offpolicy-mask", seed, 0)
        verdicts = []
        for fn in (wrong, honest):
            verdicts.append(judge(run, x, fn)[1])
        assert verdicts == [False, True], seed


def test_a_drawn_batch_of_two_binds_one_sign_and_leaves_the_other_unclipped():
    """mask-drawn's batch-2 sets (one advantage of each sign, both firsts): both sequences bound the clip before."""
    spec = member_spec("sequence-offpolicy-mask")
    seen, freed = 0, set()
    for seed in range(400):
        rw = spec.resolve(spec.workload("mask-drawn"), random.Random(seed))
        if rw.shapes["completion_ids"][0] != 2 or rw.shapes["logits"][-1] > 4000:  # a small vocabulary: cheap
            continue
        x = gen.generate(spec, rw, seed, "cpu", case=seed % 8).tensors
        p = GrpoParameters.from_spec(spec)
        keep = (x["completion_mask"] != 0).double()
        logp = torch.log_softmax(x["logits"][:, :-1].double() / p.temperature, -1).gather(
            -1, x["completion_ids"].long()[..., None]).squeeze(-1)
        s = torch.exp(((logp - x["old_logprobs"].double()) * keep).sum(-1) / keep.sum(-1).clamp(min=1.0))
        a = x["advantages"].double()
        judged = (keep.sum(-1) > 0) & (a != 0)
        if int(judged.sum()) < 2:  # an empty row (an edge row of the set) beside it: batch 1's rule, tested above
            continue
        clipped = ((a > 0) & (s > 1 + p.epsilon_high)) | ((a < 0) & (s < 1 - p.epsilon_low))
        assert bool((judged & ~clipped).any()), (seed, s, a, judged)
        if bool(judged.all()):
            assert int(clipped.sum()) == 1, (seed, s, a)
            freed.add(float(a[int((~clipped).nonzero())]) > 0)
        seen += 1
        if seen == 10:
            break
    assert seen == 10 and freed == {True, False}  # either sign's clip binds, set by set
