"""Spread peaks (generators/spread_peaks.py): the reach probe's vocabulary call plants in every row a largest logit
clear of the rest of it, one row's peak in each stratum of the vocabulary, for both operations, before the log-probs
are derived. Without it a kernel whose online log-sum-exp never rescales passed reach on one draw in a few hundred
(clean-clone CI run 182); with peaks in the upper half only, one that read the upper half first passed every time
(gallery reach-vocab-halves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import cli_here
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear.reference import generated_row_stats
from grpo_conform.ops.grpo_logits.generators.spread_peaks import PEAK_MARGIN, peak_columns
from grpo_conform.ops.grpo_terms import GrpoParameters
from grpo_conform.spec import load_family

ROOT = Path(__file__).resolve().parent.parent
FUSED = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")
LOGITS = load_family(ROOT / "specs" / "grpo.v1.json")
VOCAB = 4099


def _generate(family, member: str, axes: dict, dtype: str, seed: int, late: bool):
    spec = family.member(member)
    w = spec.workloads[0]
    lead = spec.differentiable_input.name
    dtypes = {t.name: dtype for t in spec.inputs if t.dtypes == spec.input(lead).dtypes}
    rw = spec.resolve(w.model_copy(update={"axes": {**w.axes, **axes}, "dtypes": {**w.dtypes, **dtypes}}))
    return spec, operation_for(spec).generate(spec, rw, seed, "cpu", spread_peaks=late)


def _flat_logits(x) -> torch.Tensor:
    """Every row's logits, float64 [R, V] (the logits operation's last positions included: they are peaked too)."""
    if "logits" in x.tensors:
        return x["logits"].double().reshape(-1, x["logits"].shape[-1])
    z = x["hidden"].double().reshape(-1, x["hidden"].shape[-1]) @ x["weight"].double().T
    return z + x["bias"].double() if "bias" in x.tensors else z


def _stratum(cols: torch.Tensor, rows: int, vocab: int) -> torch.Tensor:
    """Which of `rows` equal strata (stratum s: [s V // rows, (s + 1) V // rows)) each column lies in."""
    return ((cols + 1) * rows - 1) // vocab


def _planted(x, plain) -> torch.Tensor:
    """The columns the option wrote: per logits row (the logits operation), or the weight rows (fused)."""
    if "logits" in x.tensors:
        changed = (x["logits"] != plain["logits"]).reshape(-1, x["logits"].shape[-1])
        assert (changed.sum(-1) == 1).all(), "one column a row"
        return changed.float().argmax(-1)
    return torch.nonzero((x["weight"] != plain["weight"]).any(-1)).squeeze(-1)


CASES = [(FUSED, "token-offpolicy-mask", {"batch": 2, "seq": 3, "hidden": 8, "vocab": VOCAB}, "bfloat16"),
         (FUSED, "token-is-bias", {"batch": 3, "seq": 3, "hidden": 8, "vocab": VOCAB}, "float16"),  # 9 rows > H
         (FUSED, "token-offpolicy-mask-kl-ref-weight", {"batch": 2, "seq": 2, "hidden": 24, "vocab": VOCAB}, "float32"),
         (LOGITS, "token-offpolicy-mask", {"batch": 2, "seq": 3, "vocab": VOCAB}, "bfloat16"),
         (LOGITS, "token-is", {"batch": 3, "seq": 3, "vocab": VOCAB}, "float16")]


@pytest.mark.parametrize("family,member,axes,dtype", CASES, ids=[f"{c[0].id}-{c[1]}-{c[3]}" for c in CASES])
def test_every_row_peaks_by_the_margin_one_row_a_stratum_and_the_log_probs_follow(family, member, axes, dtype):
    spec, x = _generate(family, member, axes, dtype, 7, True)
    _, plain = _generate(family, member, axes, dtype, 7, False)  # the same draws without the peaks
    p = GrpoParameters.from_spec(spec)
    z, z0 = _flat_logits(x), _flat_logits(plain)
    scale = z0.std(-1).clamp_min(1.0) * max(1.0, p.temperature)
    assert ((z.amax(-1) - z0.amax(-1)) / scale >= PEAK_MARGIN / 2).all()  # rounding keeps at least half of it
    cols = _planted(x, plain)
    rows = z.shape[0]
    assert sorted(_stratum(cols, rows, z.shape[1]).tolist()) == list(range(rows)), "one peak in each stratum"
    assert bool(torch.isin(z.argmax(-1), cols).all()), "every row's largest logit is a peak column"
    # the generator's own log-probs (old and reference ones derive from them) are those of the planted values
    if "logits" in x.tensors:
        if x.logp is not None:
            zt = x["logits"][:, :-1].double() / p.temperature
            want = torch.log_softmax(zt, -1).gather(-1, x["completion_ids"].long().unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(x.logp.cpu(), want, rtol=0, atol=1e-9)
    elif x.rows is not None:
        torch.testing.assert_close(x.rows.logp.cpu(), generated_row_stats(x.tensors, p).logp.cpu(), rtol=0, atol=0)


def test_the_peak_columns_take_every_stratum_and_never_the_target():
    gen = torch.Generator().manual_seed(5)
    for rows, vocab in ((4, 8), (9, 139265), (7, 20)):
        targets = torch.randint(0, vocab, (rows,), generator=gen)
        for _ in range(20):
            cols = peak_columns(targets, vocab, gen)
            assert sorted(_stratum(cols, rows, vocab).tolist()) == list(range(rows))
            assert not bool((cols == targets).any())
            # the last stratum's peak in the last column, or the one before it where that is the row's target
            last = int(cols.argmax())
            assert int(cols[last]) == (vocab - 2 if int(targets[last]) == vocab - 1 else vocab - 1)
    on_last = torch.tensor([1, 2, 3, 19])  # the last stratum's row, whichever it is drawn to be, has its target there
    for _ in range(20):
        cols = peak_columns(on_last, 20, gen)
        assert int(cols.max()) in (18, 19) and (int(cols.max()) == 18) == bool((on_last[cols.argmax()] == 19))
    with pytest.raises(ValueError, match="at least 8 for 4 rows"):
        peak_columns(torch.zeros(4, dtype=torch.long), 7, gen)


@pytest.mark.parametrize("family,member,axes,dtype", CASES[:1] + CASES[3:4], ids=["fused", "logits"])
def test_without_the_peaks_no_row_stands_that_far_above_the_rest(family, member, axes, dtype):
    """The margin is the option's doing: the drawn rows' two largest logits lie closer than it."""
    spec, x = _generate(family, member, axes, dtype, 3, False)
    z = _flat_logits(x)
    top2 = z.topk(2, -1).values
    scale = z.std(-1).clamp_min(1.0) * max(1.0, GrpoParameters.from_spec(spec).temperature)
    assert ((top2[:, 0] - top2[:, 1]) / scale < PEAK_MARGIN / 2).any()


def test_the_reach_draws_name_the_vocabulary_call_as_peaked():
    """The record says which reach calls had their rows peaked late: the vocabulary calls (past 2^17, and past
    2^18 since the thirty-seventh session), and only they: not the multiples of 2^16 (forty-second session), whose rows
    must hold their sum in more than one chunk."""
    run = cli_here("check", ROOT / "tests" / "gallery" / "reach-vocab-tiles-32768", "--workload", "mask-small-bf16",
                   "-k", "reach", "--no-evidence", "--format", "json")
    assert run.returncode == 1, run.stderr[-2000:]  # the folder fails reach
    report = json.loads(run.stdout)
    calls = [d for w in report["implementations"][0]["workloads"] for d in w["draws"].get("reach", [])]
    peaked = [d for d in calls if d["spread_peaks"]]
    assert len(calls) >= 3 and [d["lead"] for d in peaked] == ["vocab", "vocab-wide"]
    assert peaked[0]["axes"]["vocab"] >= 139265 and peaked[1]["axes"]["vocab"] > 2 ** 18
    blocks = [d for d in calls if d["lead"] == "vocab-blocks"]
    assert {d["dtype"] for d in blocks} == {"bfloat16", "float16", "float32"}
    assert all(d["axes"]["vocab"] % 2 ** 16 == 0 and d["axes"]["vocab"] >= 2 ** 17 for d in blocks)
    assert all(d["axes"]["vocab"] < 139265 for d in calls if not d["spread_peaks"] and d["lead"] != "vocab-blocks")
