"""Every trainer-shaped row holds a token in every clip region (CI run 134's gallery failure).

The trainer-shaped probe (`ops/grpo_probes.py`) writes group-normalised advantages and right-padded masks over a
drawn input set. When the token-level log-ratios were spread over the whole batch, a short row could miss the
region where its advantage's sign makes the clip bind, and a kernel that drops the clip on a trainer's batch
(tests/gallery/zero-mean-advantages, trl-shaped-mask) passed ~1 run in 450. Now each row's positions come in
blocks that take every region (`member_inputs.draw_row_log_ratios`), the largest |advantage| of each sign sits
on a row of at least SPAN_TOKENS, and at sequence level each sign's first sequence is where the clip binds
(`draw_signed_log_ratios`): the tests below hold on every draw, not on most."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.ops.grpo_logits.member_inputs import (
    GivenInputError, binding_positions, draw_row_log_ratios, largest_by_sign, ratio_intervals,
)
from grpo_conform.ops.grpo_logits.reference import GrpoParameters
from grpo_conform.ops.grpo_probes import (
    SPAN_TOKENS, TRAINER_MIN_TOKENS, lone_success_slice, trainer_advantages, trainer_mask,
)
from member_cases import load_impl, member_names, member_spec
from conftest import GALLERY

DRAWS = 300  # per gallery folder; the old draws failed within 150 for each of them
MEMBER_DRAWS = 25  # per member: the old draws left a row without a region within a few
def _clip_members(level: str) -> list[str]:
    """Members with old log-probs whose ratio is clipped at PPO's boundaries, at importance-sampling `level`."""
    out = []
    for m in member_names():
        spec = member_spec(m)
        p = GrpoParameters.from_spec(spec)
        if ("old_logprobs" in {t.name for t in spec.inputs} and p.loss_type not in ("cispo", "vespo")
                and p.importance_sampling_level == level):
            out.append(m)
    return out


TOKEN_CLIP_MEMBERS = _clip_members("token")
SEQUENCE_CLIP_MEMBERS = _clip_members("sequence")


def _region(log_r: torch.Tensor, intervals) -> torch.Tensor:
    """The index of the interval each log-ratio lies in (-1: in none)."""
    out = torch.full(log_r.shape, -1, dtype=torch.long)
    for i, (a, b) in enumerate(intervals):
        out[(log_r >= math.log(a)) & (log_r <= math.log(b))] = i
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("seq", [1, 3, 4, 12, 13])
def test_every_block_of_every_row_takes_every_interval_once(k, seq):
    intervals = [(0.1 * 2**i, 0.15 * 2**i) for i in range(k)]
    g = torch.Generator().manual_seed(seq * 10 + k)
    for _ in range(20):
        r = _region(draw_row_log_ratios(5, seq, intervals, g), intervals)
        assert (r >= 0).all()  # every value inside its interval
        for start in range(0, seq, k):
            block = r[:, start:start + k]
            for row in block:  # a whole block is a permutation; the last, cut short, repeats none
                assert len(set(row.tolist())) == row.numel()


def test_the_blocks_are_drawn_not_fixed():
    intervals = [(0.1, 0.2), (0.5, 0.7), (1.5, 2.0)]
    g = torch.Generator().manual_seed(1)
    firsts = {tuple(_region(draw_row_log_ratios(1, 3, intervals, g), intervals)[0].tolist()) for _ in range(60)}
    assert len(firsts) == 6  # every order of the three regions turns up


def _trainer_set(member: str, seed: int, lone: bool = False):
    """A set of `member` at mask-small-bf16 drawn as the trainer-shaped probe draws it: advantages and mask
    given (`grpo_probes.trainer_advantages`, `trainer_mask`), the rest drawn given them; `lone`: then with the
    advantages of its second call (TS-lone), the lone success on the largest negative trainer advantage's row."""
    spec = member_spec(member)
    rw = spec.resolve(spec.workload("mask-small-bf16"), random.Random(seed))
    batch, seq = rw.shapes["completion_ids"]
    g = torch.Generator().manual_seed(seed ^ 0x7EA2)
    adv = trainer_advantages(batch, g)
    given = {"advantages": adv, "completion_mask": trainer_mask(batch, seq, g, adv)}
    x = gen.generate(spec, rw, seed, "cpu", values=spec.parameter_values, given=given)
    assert torch.equal(x.tensors["advantages"].double(), given["advantages"].to(x.tensors["advantages"].dtype).double())
    assert torch.equal(x.tensors["completion_mask"] != 0, given["completion_mask"])
    if lone:
        row = largest_by_sign(adv)[-1]
        x.tensors["advantages"].copy_(lone_success_slice(batch, g, row).to(x.tensors["advantages"].dtype))
        assert int(x.tensors["advantages"].argmax()) == row
    return spec, x.tensors, x.logp


@pytest.mark.parametrize("member", TOKEN_CLIP_MEMBERS)
def test_the_largest_advantage_of_each_sign_has_a_row_in_every_clip_region(member):
    short = 0
    for seed in range(MEMBER_DRAWS):
        spec, t, logp = _trainer_set(member, seed)
        p = GrpoParameters.from_spec(spec)
        intervals = ratio_intervals(p, spec.validation.member_inputs)
        keep = t["completion_mask"] != 0
        assert (keep.sum(-1) >= min(TRAINER_MIN_TOKENS, keep.shape[1])).all()
        short += int((keep.sum(-1) < SPAN_TOKENS).sum())
        assert len(intervals) <= SPAN_TOKENS
        regions = _region(logp - t["old_logprobs"].double(), intervals)
        adv = t["advantages"].double()
        for side in (adv > 0, adv < 0):
            b = int(torch.where(side, adv.abs(), torch.tensor(-1.0, dtype=torch.float64)).argmax())
            assert bool(side[b]) and set(regions[b][keep[b]].tolist()) >= set(range(len(intervals))), (member, seed, b)
    assert short > 0  # rows of two and three tokens stay in the trainer sets


@pytest.mark.parametrize("member", SEQUENCE_CLIP_MEMBERS)
def test_every_trainer_set_has_a_sequence_where_the_clip_binds_for_each_sign(member):
    assert SEQUENCE_CLIP_MEMBERS  # GSPO is a member of the family
    for seed in range(DRAWS):
        spec, t, logp = _trainer_set(member, seed)
        intervals = ratio_intervals(GrpoParameters.from_spec(spec), spec.validation.member_inputs)
        keep = (t["completion_mask"] != 0).double()
        s = ((logp - t["old_logprobs"].double()) * keep).sum(-1) / keep.sum(-1)
        region = _region(s, intervals)
        adv = t["advantages"].double()
        assert bool(((adv > 0) & (region == len(intervals) - 1)).any()), (member, seed, region, adv)
        assert bool(((adv < 0) & (region == 0)).any()), (member, seed, region, adv)


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask"])
def test_the_binding_token_of_each_held_row_is_never_near_one_hot_and_the_rest_can_be(member):
    """A token whose target holds nearly all the probability (the `peaked` profile: a spike of 40) has a gradient
    of ~1e-16: one draw of 150 put every binding token of the probe's rows on such rows, and a kernel dropping the
    clip in its backward alone passed. Each held row (largest |A| of its sign) has one drawn position among its
    first two that is not near one-hot and, at token level, where the clip binds for its sign; every other token,
    those rows' included, can be near one-hot (a whole row kept off it was a feature a kernel could test)."""
    held_peaked = 0
    for seed in range(MEMBER_DRAWS):
        spec, t, logp = _trainer_set(member, seed)
        intervals = ratio_intervals(GrpoParameters.from_spec(spec), spec.validation.member_inputs)
        regions = _region(logp - t["old_logprobs"].double(), intervals)
        p_target = logp.exp()
        adv = t["advantages"]
        binding = binding_positions(adv, t["completion_mask"].shape[1], seed)
        assert set(binding) == set(largest_by_sign(adv).values())
        for row, pos in binding.items():
            assert pos in (0, 1) and bool(t["completion_mask"][row, pos])
            assert float(p_target[row, pos]) < 0.999, (seed, row, pos)
            if member.startswith("token"):
                assert int(regions[row, pos]) == (len(intervals) - 1 if float(adv[row]) > 0 else 0), (seed, row)
            held_peaked += int((p_target[row] > 0.999).sum())
    assert held_peaked > 0  # the held rows' other tokens still take the peaked profile


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask", "bnpo-mask"])
def test_the_lone_success_sits_where_a_positive_advantage_is_not_clipped(member):
    """TS-lone's large advantage must reach the gradient: its row (token level: some kept token; GSPO: the
    sequence) has a ratio below 1 + eps_high, where min(r A, clip(r) A) = r A for A > 0."""
    for seed in range(MEMBER_DRAWS):
        spec, t, logp = _trainer_set(member, seed, lone=True)
        p = GrpoParameters.from_spec(spec)
        row = int(t["advantages"].argmax())
        keep = (t["completion_mask"][row] != 0).double()
        log_r = logp[row] - t["old_logprobs"][row].double()
        if p.importance_sampling_level == "sequence":
            unclipped = float((log_r * keep).sum() / keep.sum()) < math.log(1 + p.epsilon_high)
        else:
            unclipped = bool(((log_r < math.log(1 + p.epsilon_high)) & (keep > 0)).any())
        assert unclipped, (member, seed, row)


def test_a_given_input_the_generators_do_not_take_is_refused():
    spec = member_spec("token-offpolicy-mask")
    rw = spec.resolve(spec.workload("mask-small-bf16"), random.Random(0))
    with pytest.raises(GivenInputError, match="old_logprobs.*pass only"):
        gen.generate(spec, rw, 0, "cpu", given={"old_logprobs": torch.zeros(4, 12)})


@pytest.mark.parametrize("folder,member,lone", [("zero-mean-advantages", "token-offpolicy-mask", False),
                                                ("trl-shaped-mask", "token-offpolicy-mask", False),
                                                ("trainer-sequence-clip-dropped", "sequence-offpolicy-mask", False),
                                                ("trainer-sequence-clamps-large-advantages", "sequence-offpolicy-mask",
                                                 True)])
def test_a_trainer_shortcut_changes_the_gradient_on_every_draw(folder, member, lone):
    """The gallery folders against the honest loss they wrap, on DRAWS trainer-shaped sets (the lone ones: the
    probe's second call): the logits' gradient differs on every one (token level: not on ~1 in 450 before;
    GSPO: not on ~1 in 5; the GSPO clamp: not on ~1 in 3)."""
    wrong = load_impl(GALLERY / folder)
    honest = load_impl(GALLERY.parent.parent / "implementations" / "pytorch")
    for seed in range(DRAWS):
        spec, t, _ = _trainer_set(member, seed, lone)
        grads = []
        for fn in (wrong, honest):
            leaf = t["logits"].detach().clone().requires_grad_(True)
            fn(leaf, **{k: v for k, v in t.items() if k != "logits"}, **spec.parameter_values).backward()
            grads.append(leaf.grad.float())
        assert (grads[0] - grads[1]).abs().max() > 1e-3, (folder, seed)


@pytest.mark.parametrize("batch,seq", [(2, 3), (2, 5), (4, 12), (3, 4), (1, 12), (4, 2), (2, 12)])
@pytest.mark.parametrize("with_advantages", [False, True])
def test_trainer_masks_hold_their_rows_and_are_never_all_one_length_where_rows_can_differ(batch, seq, with_advantages):
    """Equal lengths make the normalisers agree and leave no row padded. The rows can all be equal only where one
    length fits (a batch of one, seq <= TRAINER_MIN_TOKENS), or where two held rows must both span a short seq."""
    least, span = min(TRAINER_MIN_TOKENS, seq), min(SPAN_TOKENS, seq)
    g = torch.Generator().manual_seed(batch * 100 + seq)
    for _ in range(300):
        adv = trainer_advantages(batch, g) if with_advantages and batch >= 2 else None
        lengths = trainer_mask(batch, seq, g, adv).sum(-1)
        assert bool((lengths >= least).all()) and bool((lengths <= seq).all())
        if adv is not None:
            for side in (adv > 0, adv < 0):
                b = int(torch.where(side, adv.abs(), torch.tensor(-1.0, dtype=torch.float64)).argmax())
                assert lengths[b] >= span, (adv, lengths)
        equal = bool((lengths == lengths[0]).all())
        forced = batch == 1 or seq <= least or (adv is not None and batch == 2 and span == seq)
        if not forced:
            assert not equal and bool((lengths < seq).any()), lengths


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask"])
def test_the_fused_generator_draws_given_the_trainer_s_advantages_and_mask(member):
    """grpo-fused-linear's generator honours `given` and draws its old log-probs with the same guarantees
    (its log-probs come from hidden @ weight: the generator's row pass)."""
    from grpo_conform.ops import operation_for
    from grpo_conform.spec import find_spec

    spec = find_spec(f"grpo-fused-linear/{member}")
    rw = spec.resolve(spec.workload("tiny-bf16"), random.Random(0))
    batch, seq = rw.shapes["completion_ids"]
    op = operation_for(spec)
    intervals = ratio_intervals(GrpoParameters.from_spec(spec), spec.validation.member_inputs)
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        adv = trainer_advantages(batch, g)
        given = {"advantages": adv, "completion_mask": trainer_mask(batch, seq, g, adv)}
        x = op.generate(spec, rw, seed, "cpu", values=spec.parameter_values, given=given)
        t = x.tensors
        assert torch.equal(t["completion_mask"] != 0, given["completion_mask"])
        assert torch.allclose(t["advantages"].double(), given["advantages"], atol=1e-6)
        keep = given["completion_mask"]
        log_r = x.rows.logp.cpu() - t["old_logprobs"].double()
        if member.startswith("sequence"):
            s = (log_r * keep).sum(-1) / keep.sum(-1)
            region, adv = _region(s, intervals), given["advantages"]
            assert bool(((adv > 0) & (region == len(intervals) - 1)).any()) and bool(((adv < 0) & (region == 0)).any())
        else:
            regions = _region(log_r, intervals)
            for side in (adv > 0, adv < 0):
                b = int(torch.where(side, adv.abs(), torch.tensor(-1.0, dtype=torch.float64)).argmax())
                assert set(regions[b][keep[b]].tolist()) >= set(range(len(intervals))), (seed, b)
