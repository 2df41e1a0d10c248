"""The GEMM ceiling (grpo_conform/gemm_ceiling.py, issue 31 item 4): which GEMMs each protocol of the
fused operation cannot avoid, their FLOP count as the floor uses it, a measurement on the CPU (the
CUDA path is the same function with CUDA events), and the ratio a timed protocol gets: none when the
ceiling was disturbed (a hostile worker loading the GPU while the parent measures would otherwise make
its own ratio look better) or not measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_conform import gemm_ceiling
from grpo_conform.ops import operation_for
from grpo_conform.spec import find_spec, load_family

ROOT = Path(__file__).resolve().parent.parent
FAMILY = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")


def _gemms(member: str, protocol: str, workload: str = "seed-b2"):
    spec = FAMILY.member(member)
    rw = spec.resolve(spec.workload(workload))
    return operation_for(spec).gemms(spec, rw, protocol), spec, rw


def test_each_protocol_names_the_gemms_it_cannot_avoid():
    fwd, spec, rw = _gemms("token-offpolicy-mask", "forward")
    full, _, _ = _gemms("token-is", "full")
    assert [(g.m, g.k, g.n) for g in fwd] == [(2048, 4096, 128256)]  # the seed shape: N = 2 x 1024
    assert _gemms("token-is", "forward")[0] == ()  # the ratio is exactly 1: its loss value reads no logits
    assert [(g.m, g.k, g.n, g.transposed) for g in full] == [
        (2048, 4096, 128256, "b"), (2048, 128256, 4096, ""), (128256, 2048, 4096, "a")]
    assert _gemms("token-is", "full-scaled")[0] == full
    assert _gemms("token-is", "backward")[0] == ()  # work can move into forward: no ceiling
    ref, _, _ = _gemms("token-offpolicy-mask-kl-ref-weight", "full")
    assert len(ref) == 4 and ref[-1].what.startswith("reference logits")
    flops, text = operation_for(spec).flops(spec, rw, "full")
    assert flops == sum(g.flops for g in full) == 3 * 2 * 2048 * 4096 * 128256
    assert text.endswith("(logits, d hidden, d weight)")
    logits = find_spec("grpo-token-is")
    assert operation_for(logits).gemms(logits, logits.resolve(logits.workloads[0]), "full") == ()


def test_the_ceiling_is_measured_and_the_ratio_attached():
    gemms, _, _ = _gemms("token-is", "full", "tiny-bf16")
    c = gemm_ceiling.measure(gemms, torch.device("cpu"), gemm_ceiling.CeilingSettings(reps=3, warmup=1),
                             flop_floor_ns=1_000_000_000)
    assert c["measured"] and c["median_ns"] > 0 and c["event"]["reps"] == 3 and not c["disturbed"]
    assert c["flops"] == sum(g.flops for g in gemms) and len(c["gemms"]) == 3
    result = {"event": {"median_ns": 3 * c["median_ns"]}}
    gemm_ceiling.attach(result, c)
    assert result["gemm_ceiling"] is c and result["gemm_ceiling_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert gemm_ceiling.measure((), torch.device("cpu")) is None


def test_a_disturbed_or_unmeasured_ceiling_gives_no_ratio():
    gemms, _, _ = _gemms("token-offpolicy-mask", "forward", "tiny-bf16")
    # a ceiling far slower than the FLOP floor: something else ran on the device while it was measured
    c = gemm_ceiling.measure(gemms, torch.device("cpu"), gemm_ceiling.CeilingSettings(reps=2, warmup=0),
                             flop_floor_ns=1)
    assert c["disturbed"] and c["vs_flop_floor"] > gemm_ceiling.DISTURBED
    result = {"event": {"median_ns": 10}}
    gemm_ceiling.attach(result, c)
    assert "gemm_ceiling_ratio" not in result and result["gemm_ceiling"]["disturbed"]
    result = {"event": {"median_ns": 10}}
    gemm_ceiling.attach(result, {"measured": False, "reason": "out of memory"})
    assert "gemm_ceiling_ratio" not in result
    gemm_ceiling.attach(result, None)
    assert result["gemm_ceiling"] == {"measured": False, "reason": "out of memory"}


def test_the_ceiling_multiplies_the_timed_inputs_own_values(monkeypatch):
    """A GEMM's time depends on its operands' values (an H100: 1.049x on a workload's draw against N(0, 1) x 0.02),
    so the ceiling takes the inputs' values where an input holds the operand; d logits (no input) is drawn. A
    value of another dtype or size is not used (drawn instead), and the result says which operand was which."""
    gemms, spec, rw = _gemms("token-offpolicy-mask-kl-ref-weight", "full", "tiny-bf16")
    assert [g.operands for g in gemms] == [("hidden", "weight"), ("", "weight"), ("", "hidden"),
                                           ("ref_hidden", "ref_weight")]
    x = operation_for(spec).generate(spec, rw, 7, torch.device("cpu"))
    values = {k: x[k] for k in ("hidden", "weight", "ref_hidden", "ref_weight")}
    seen = []
    real_mm = torch.mm

    def spy(a, b, out=None):
        seen.append((a.data_ptr(), b.data_ptr()))
        return real_mm(a, b, out=out)

    monkeypatch.setattr(gemm_ceiling.torch, "mm", spy)
    c = gemm_ceiling.measure(gemms, torch.device("cpu"), gemm_ceiling.CeilingSettings(reps=1, warmup=0), values=values)
    assert c["operands"] == [["hidden", "weight"], ["drawn", "weight"], ["drawn", "hidden"], ["ref_hidden", "ref_weight"]]
    ptr = {k: v.data_ptr() for k, v in values.items()}
    first = seen[:4]  # one timed rep: the four GEMMs in order
    assert first[0] == (ptr["hidden"], ptr["weight"]) and first[1][1] == ptr["weight"]
    assert first[2][1] == ptr["hidden"] and first[3] == (ptr["ref_hidden"], ptr["ref_weight"])
    assert first[1][0] not in ptr.values() and first[2][0] not in ptr.values()  # d logits: drawn
    wrong = dict(values, weight=values["weight"].float(), hidden=values["hidden"][:1])
    c = gemm_ceiling.measure(gemms, torch.device("cpu"), gemm_ceiling.CeilingSettings(reps=1, warmup=0), values=wrong)
    assert c["operands"][0] == ["drawn", "drawn"] and c["operands"][3] == ["ref_hidden", "ref_weight"]
    assert gemm_ceiling.measure(gemms[:1], torch.device("cpu"), gemm_ceiling.CeilingSettings(reps=1, warmup=0)
                                )["operands"] == [["drawn", "drawn"]]  # no values: drawn, as before


def test_a_run_on_cuda_takes_inputs_on_cuda_0():
    """The run's device is often `cuda` and the inputs' `cuda:0`, which torch calls different devices: the
    ceiling would then draw every operand without a word on the GPU (found before any GPU ran it)."""
    same = gemm_ceiling._same_device
    assert same(torch.device("cuda:0"), torch.device("cuda")) and same(torch.device("cuda"), torch.device("cuda:0"))
    assert not same(torch.device("cuda:1"), torch.device("cuda:0")) and not same(torch.device("cpu"), torch.device("cuda"))
    assert same(torch.device("cpu"), torch.device("cpu"))


def test_the_run_s_ceiling_function_hands_the_values_on():
    """check.RunContext.gemm_ceiling_fn is what the timed protocols call with their first buffer set's pristine
    values (checks/timed.py): the values reach the measurement."""
    from grpo_conform.check import RunContext

    gemms, spec, rw = _gemms("token-offpolicy-mask", "forward", "tiny-bf16")
    x = operation_for(spec).generate(spec, rw, 3, torch.device("cpu"))
    ceiling = RunContext(torch.device("cpu"), None).gemm_ceiling_fn(spec, rw)
    assert ceiling("forward", {"hidden": x["hidden"], "weight": x["weight"]})["operands"] == [["hidden", "weight"]]
    assert ceiling("forward")["operands"] == [["drawn", "drawn"]]


def test_the_split_layouts_compute_the_whole_products():
    """The ceiling also times each GEMM in pieces of rows (a whole 16384-row GEMM ran ~12% slower per row than
    2048-row pieces on an H200). A layout that skipped or repeated a piece would time other work than the
    GEMMs: every layout must leave exactly the whole product, "m" pieces in their own rows, "k" pieces summed."""
    from grpo_conform.ops.interface import Gemm

    gen = torch.Generator().manual_seed(5)
    gemms = [Gemm(7, 5, 6, "float32", "m split", "", rows="m"), Gemm(6, 9, 4, "float32", "k split", "a", rows="k"),
             Gemm(5, 3, 2, "float32", "never split", "b")]
    pairs = [(torch.randn(7, 5, generator=gen), torch.randn(5, 6, generator=gen)),
             (torch.randn(9, 6, generator=gen).t(), torch.randn(9, 4, generator=gen)),
             (torch.randn(5, 3, generator=gen), torch.randn(2, 3, generator=gen).t())]
    want = [a @ b for a, b in pairs]
    for rows in (None, 1, 2, 3, 4, 100):
        outs = [torch.full((g.m, g.n), float("nan")) for g in gemms]
        gemm_ceiling._runner(gemms, pairs, outs, [rows, rows, rows])()
        for got, expected in zip(outs, want):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    outs = [torch.full((g.m, g.n), float("nan")) for g in gemms]
    gemm_ceiling._runner(gemms, pairs, outs, [2, None, 3])()  # each GEMM in a layout of its own
    for got, expected in zip(outs, want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert gemm_ceiling._pieces(7, 3) == [(0, 3), (3, 6), (6, 7)] and gemm_ceiling._pieces(7, None) == [(0, 7)]


def test_each_gemm_takes_its_fastest_layout_and_the_ceiling_times_them_together(monkeypatch):
    """Each GEMM is timed alone in every layout that splits it; the ceiling is every GEMM in its own fastest
    layout, timed back to back (a kernel may chunk d hidden's rows and not d weight's sum). A GEMM without a
    rows dimension is never split, and a piece size that splits nothing is not timed."""
    from grpo_conform.ops.interface import Gemm

    gemms, _, _ = _gemms("token-is", "full", "tiny-bf16")
    assert [g.rows for g in gemms] == ["m", "m", "k"]
    rows = gemms[0].m
    half = rows // 2
    settings = gemm_ceiling.CeilingSettings(reps=1, warmup=0, row_chunks=(half, rows, 10 * rows))
    assert gemm_ceiling._layouts(gemms[0], settings) == [None, half]
    assert gemm_ceiling._layouts(Gemm(64, 8, 8, "float32", "no rows"), settings) == [None]
    # alone: GEMM 1 whole 300, halves 100; GEMM 2 whole 50, halves 80; GEMM 3 whole 70, halves 90; then together 400
    fake = iter([[300], [100], [50], [80], [70], [90], [400]])
    built = []
    real = gemm_ceiling._runner
    monkeypatch.setattr(gemm_ceiling, "_runner", lambda g, p, o, r: built.append(list(r)) or real(g, p, o, r))
    monkeypatch.setattr(gemm_ceiling, "_time_cpu", lambda fn, reps, warmup: (fn(), next(fake))[1])
    c = gemm_ceiling.measure(gemms, torch.device("cpu"), settings)
    assert c["layouts"] == [{"whole": 300, f"rows of {half}": 100}, {"whole": 50, f"rows of {half}": 80},
                            {"whole": 70, f"rows of {half}": 90}]
    assert c["layout"] == [f"rows of {half}", "whole", "whole"] and built[-1] == [half, None, None]
    assert c["median_ns"] == 400 and c["event"]["median_ns"] == 400  # the combination, timed together
    fake = iter([[30], [20]])  # one GEMM: its fastest layout alone is the ceiling, not timed again
    one = gemm_ceiling.measure(gemms[:1], torch.device("cpu"), settings)
    assert one["layout"] == [f"rows of {half}"] and one["median_ns"] == 20 and next(fake, None) is None
