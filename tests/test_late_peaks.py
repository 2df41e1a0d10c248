"""Late peaks (generators/late_peaks.py): the reach probe's vocabulary call puts every row's largest logit in
the vocabulary's upper half, clear of the lower half, for both operations, before the log-probs are derived.
Without it a kernel whose online log-sum-exp never rescales passed reach on one draw in a few hundred (clean-clone
CI run 182; the gallery's fused-reach-vocab-tiles must fail reach on every draw)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear.reference import generated_row_stats
from grpo_conform.ops.grpo_logits.generators.late_peaks import PEAK_MARGIN
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
    return spec, operation_for(spec).generate(spec, rw, seed, "cpu", late_peaks=late)


def _rows(spec, x) -> torch.Tensor:
    """Every scored row's logits, float64 [R, V] (the logits operation's last position has no token)."""
    if "logits" in x.tensors:
        return x["logits"][:, :-1].double().reshape(-1, x["logits"].shape[-1])
    z = x["hidden"].double().reshape(-1, x["hidden"].shape[-1]) @ x["weight"].double().T
    return z + x["bias"].double() if "bias" in x.tensors else z


def _late(z: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    lower = z[:, : z.shape[1] // 2].amax(-1)
    scale = z[:, : z.shape[1] // 2].std(-1).clamp_min(1.0) * max(1.0, temperature)
    return z.argmax(-1) >= z.shape[1] // 2, (z.amax(-1) - lower) / scale


CASES = [(FUSED, "token-offpolicy-mask", {"batch": 2, "seq": 3, "hidden": 8, "vocab": VOCAB}, "bfloat16"),
         (FUSED, "token-is-bias", {"batch": 3, "seq": 3, "hidden": 8, "vocab": VOCAB}, "float16"),  # 9 rows > H
         (FUSED, "token-offpolicy-mask-kl-ref-weight", {"batch": 2, "seq": 2, "hidden": 24, "vocab": VOCAB}, "float32"),
         (LOGITS, "token-offpolicy-mask", {"batch": 2, "seq": 3, "vocab": VOCAB}, "bfloat16"),
         (LOGITS, "token-is", {"batch": 3, "seq": 3, "vocab": VOCAB}, "float16")]


@pytest.mark.parametrize("family,member,axes,dtype", CASES, ids=[f"{c[0].id}-{c[1]}-{c[3]}" for c in CASES])
def test_every_row_peaks_in_the_upper_half_by_the_margin_and_the_log_probs_follow(family, member, axes, dtype):
    spec, x = _generate(family, member, axes, dtype, 7, True)
    p = GrpoParameters.from_spec(spec)
    upper, margin = _late(_rows(spec, x), p.temperature)
    assert upper.all(), "a row's largest logit stayed in the lower half"
    assert (margin >= PEAK_MARGIN / 2).all(), margin  # rounding keeps at least half of it
    # the generator's own log-probs (old and reference ones derive from them) are those of the planted values
    if "logits" in x.tensors:
        if x.logp is not None:
            z = x["logits"][:, :-1].double() / p.temperature
            want = torch.log_softmax(z, -1).gather(-1, x["completion_ids"].long().unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(x.logp.cpu(), want, rtol=0, atol=1e-9)
    elif x.rows is not None:
        torch.testing.assert_close(x.rows.logp.cpu(), generated_row_stats(x.tensors, p).logp.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("family,member,axes,dtype", CASES[:1] + CASES[3:4], ids=["fused", "logits"])
def test_without_late_peaks_the_drawn_maxima_fall_anywhere(family, member, axes, dtype):
    """The property is the option's doing: the same draws without it put some row's maximum in the lower half."""
    lower_seen = 0
    for seed in range(4):
        spec, x = _generate(family, member, axes, dtype, seed, False)
        upper, _ = _late(_rows(spec, x), GrpoParameters.from_spec(spec).temperature)
        lower_seen += int((~upper).sum())
    assert lower_seen > 0


def test_the_reach_draws_name_the_vocabulary_call_as_peaked():
    """The record says which reach call had its rows peaked late: the vocabulary call, and only it."""
    run = subprocess.run([sys.executable, "-m", "grpo_conform", "check", str(ROOT / "tests" / "gallery" / "reach-vocab-tiles-32768"),
                          "--workload", "mask-small-bf16", "-k", "reach", "--no-evidence", "--format", "json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 1, run.stderr[-2000:]  # the folder fails reach
    report = json.loads(run.stdout)
    calls = [d for w in report["implementations"][0]["workloads"] for d in w["draws"].get("reach", [])]
    peaked = [d for d in calls if d["late_peaks"]]
    assert len(calls) >= 3 and len(peaked) == 1
    assert peaked[0]["axes"]["vocab"] >= 139265 and all(d["axes"]["vocab"] < 139265 for d in calls if not d["late_peaks"])
