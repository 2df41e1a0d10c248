"""The layouts probe's set V reaches the loss and gradient on every row (ops/grpo_views.py), drawn here as the
float16 pass of other-dtypes draws it (the member's smallest workload, axes drawn up to 1.5x), without a worker.

A kernel reading a strided input at a contiguous pitch misreads every row but the first. Before, the float16 pass's
V held one sequence with the mask rotation's `single` layout; where that one token's ratio sat where the clip
binds, or at sequence level (the first sequence of a sign binds), the call had no gradient at all and
tests/gallery/fp16-rows-at-vocab-pitch passed about 1 run in 8 (docs/checks.md)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from conftest import GALLERY
from grpo_conform.checks import member_calls
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.reference_cache import ReferenceCache
from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits.reference import (GrpoParameters, reference_gradient_dense, reference_logprobs,
                                                  reference_loss)
from grpo_conform.ops.grpo_terms import token_terms, token_weights
from grpo_conform.ops.grpo_views import KEPT, draw_views, edge_kinds, edge_rows, view_mask
from member_cases import load_impl, member_names, member_spec

DRAWS = 4  # per member (~50 ms a draw): the old sets failed the first on every member's first draw
KERNEL_DRAWS = 24  # the old sets gave the gallery kernel a deaf call on 12 draws of 100 (16 and 19 among these)
MEMBERS = [m for m in member_names() if "float16" in member_calls.unused_dtypes(member_spec(m), "cpu")]


class _Slot:
    """What draw_views reads of an InputSlot: the pristine copies, written in place."""

    def __init__(self) -> None:
        self.pristine: dict[str, torch.Tensor] = {}
        self.version = 0

    def write(self, values: dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            self.pristine[k].copy_(v)
        self.version += 1


def _float16_views(member: str, seed: int) -> tuple[SimpleNamespace, dict[str, torch.Tensor], dict]:
    spec = member_spec(member)
    w = member_calls.smallest_workload(spec, "cpu")
    axes = member_calls.drawn_axes(spec, w, "float16", random.Random(seed))
    rw = spec.resolve(w.model_copy(update={"dtypes": member_calls.with_dtype(spec, w, "float16"), "axes": axes}))
    op, model = operation_for(spec), ReferenceModel.drawn(spec, random.Random(seed))

    def generate(slot, s, given=None):
        slot.pristine = op.generate(spec, rw, s, torch.device("cpu"), values=model.values, case=3, given=given).tensors
    run = SimpleNamespace(spec=spec, op=op, rw=rw, model=model, refs=ReferenceCache(), generate=generate,
                          slot_key=lambda slot: ("V", 0, slot.version))
    slot = _Slot()
    drawn = draw_views(run, slot, seed)
    return run, slot.pristine, drawn


@pytest.mark.parametrize("member", MEMBERS)
def test_every_row_of_the_float16_views_holds_live_tokens_with_audible_advantages(member):
    """Each sequence keeps >= 2/3 of its positions, |A| >= 0.25, and tokens past the first position (every one a
    contiguous pitch misreads) with dL/dlogp far from 0: a wrong read of them moves the loss and the gradient."""
    for seed in range(DRAWS):
        run, x, drawn = _float16_views(member, seed)
        p = GrpoParameters.from_spec(run.spec, run.model.values)
        batch, seq = x["completion_ids"].shape
        keep = x["completion_mask"] != 0 if "completion_mask" in x else torch.ones(batch, seq, dtype=torch.bool)
        rows = [b for b in range(batch) if str(b) not in drawn["edge_rows"]]  # edge rows: the test below
        assert rows and (batch < 2 or 1 in rows or rows != [0]), drawn  # a row past the first is audible
        assert drawn["least_kept"] >= math.ceil(KEPT * seq) and (keep[rows].sum(-1) >= math.ceil(KEPT * seq)).all()
        assert (x["advantages"].abs() >= 0.25).all(), (seed, x["advantages"])
        coef = token_terms(x, p, reference_logprobs(x, p)).dlogp.abs()
        scale = token_weights(keep, p) * x["advantages"].double().abs()[:, None]  # a term linear in r, at r = 1
        live = (coef > 1e-3 * scale)[:, 1:] & keep[:, 1:]  # VESPO's weight phi(w) goes down to ~2e-3
        assert (live[rows].sum(-1) >= 2).all(), (seed, live.sum(-1).tolist(), drawn)


def _strided(logits: torch.Tensor, pad: int) -> torch.Tensor:
    """`logits` as the layouts probe passes them: a view at an offset of a buffer padded in every dimension."""
    b, s, v = logits.shape
    base = torch.zeros(b + 1, s + 1, v + pad, dtype=logits.dtype)
    view = base[1:, 1:, :v]
    view.copy_(logits)
    return view


def test_the_contiguous_pitch_kernel_is_wrong_on_every_float16_views_draw():
    """The gallery's kernel (fp16-rows-at-vocab-pitch), called on V's float16 logits as a padded view: its loss or
    gradient is off by far more than float16's allowance (~0.2% of the gradient's norm) on every draw."""
    fn = load_impl(GALLERY / "fp16-rows-at-vocab-pitch")
    for seed in range(KERNEL_DRAWS):
        run, x, _ = _float16_views("luspo-mask", seed)
        p = GrpoParameters.from_spec(run.spec, run.model.values)
        logits = _strided(x["logits"], 1 + seed % 5).requires_grad_(True)
        loss = fn(logits, **{k: v for k, v in x.items() if k != "logits"}, **run.model.call_values)
        (grad,) = torch.autograd.grad(loss, logits)
        loss = float(loss.detach())
        want, want_loss = reference_gradient_dense(x, p), reference_loss(x, p)
        finite = bool(torch.isfinite(grad).all()) and math.isfinite(loss)
        grad_off = float((grad.double() - want).norm()) > 0.05 * float(want.norm())  # both 0: a deaf call
        loss_off = abs(loss - want_loss) > 0.05 * abs(want_loss)
        assert not finite or grad_off or loss_off, (seed, loss, want_loss, float(want.norm()))


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 7])
def test_edge_rows_take_the_layouts_the_audible_rows_exclude(batch):
    """From batch 2 on, batch // 2 rows (up to one per kind) are an empty row, a single kept token or a sequence
    left as drawn; at batch 2 the edge is row 0, so row 1 (a wrong batch pitch misreads it) stays audible; a batch
    of one has no edge; of two or more other rows one keeps every position. Without them a strided-only path that
    mishandles an empty row passed every call (gallery strided-mean-over-nonempty-rows)."""
    kinds = edge_kinds(True, True)
    assert kinds == ("empty", "single", "clipped", "zero")
    for seed in range(20):
        r = random.Random(seed)
        edges = edge_rows(batch, kinds, r, seed % 3)
        assert len(edges) == min(4, batch // 2) and len(set(edges.values())) == len(edges)
        if batch == 2:
            assert list(edges) == [0]
        keep = view_mask(batch, 9, r, edges)
        for b in range(batch):
            want = {"empty": 0, "single": 1}.get(edges.get(b))
            assert (int(keep[b].sum()) == want) if want is not None else int(keep[b].sum()) >= 6, (b, edges, keep)
        rest = [b for b in range(batch) if b not in edges]
        assert len(rest) < 2 or any(bool(keep[b].all()) for b in rest), (edges, keep)  # one unpadded row
    assert edge_kinds(False, False) == ("zero",) and edge_kinds(False, True) == ("clipped", "zero")


def test_the_strided_calls_take_the_edge_kinds_in_turn():
    """A set of four rows holds two edges; L (turn 0) and the L2 calls (turns 1, 2) hold every kind between them,
    each kind in two of the three (token level with a mask: empty, single, zero)."""
    kinds = edge_kinds(True, False)
    held = [set(edge_rows(4, kinds, random.Random(t), t).values()) for t in range(3)]
    assert all(len(h) == 2 for h in held) and all(sum(k in h for h in held) == 2 for k in kinds), held


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "token-is"])
def test_a_zero_edge_row_has_a_zero_advantage_and_the_other_rows_are_audible(member):
    """The zero edge row: A exactly 0 on a row of kept tokens; every other row's |A| >= 0.25."""
    spec = member_spec(member)
    w = next(w for w in spec.workloads if w.axes.get("batch", 0) >= 2 and not w.timed)
    rw = spec.resolve(w)
    op, model = operation_for(spec), ReferenceModel.drawn(spec, random.Random(0))
    found = 0
    for turn in range(3):
        def generate(slot, s, given=None):
            slot.pristine = op.generate(spec, rw, s, torch.device("cpu"), values=model.values, case=3,
                                        given=given).tensors
        run = SimpleNamespace(spec=spec, op=op, rw=rw, model=model, refs=ReferenceCache(), generate=generate,
                              slot_key=lambda slot: ("V", 0, slot.version))
        slot = _Slot()
        drawn = draw_views(run, slot, 11, turn)
        adv = slot.pristine["advantages"]
        zero = [int(b) for b, k in drawn["edge_rows"].items() if k == "zero"]
        found += len(zero)
        for b in range(adv.shape[0]):
            if b in zero:
                assert float(adv[b]) == 0.0
            elif str(b) not in drawn["edge_rows"]:
                assert abs(float(adv[b])) >= 0.25, (b, adv)
    assert found >= 1


def test_an_edge_sequence_keeps_its_drawn_ratio():
    """live_sequences moves every row's ratio into the live interval but a `left` (clipped edge) row's, whose old
    log-probs and reported target stay the generator's."""
    from grpo_conform.ops.grpo_views import live_sequences

    spec = member_spec("sequence-offpolicy-mask")
    model = ReferenceModel.drawn(spec, random.Random(0))
    p = GrpoParameters.from_spec(spec, model.values)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 10, generator=g, dtype=torch.float64) * 3
    old = logp + 2.0  # every ratio exp(-2): far below any live interval
    keep = torch.ones(4, 10, dtype=torch.bool)
    moved, targets = live_sequences(old, logp, keep, torch.ones(4), p, spec.validation.member_inputs,
                                    random.Random(1), left=(2,))
    assert torch.equal(moved[2], old[2]) and targets[2] == pytest.approx(-2.0)
    for b in (0, 1, 3):
        assert not torch.equal(moved[b], old[b]) and abs((logp[b] - moved[b]).mean() - targets[b]) < 1e-12
        assert abs(targets[b]) < 0.5
