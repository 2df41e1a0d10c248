"""The part of issue 36's sweep that measures the staged HEAD path (benchmarks/h200_evidence.sh sweep36b):
benchmarks/sweep_select.py's job selection and the launch candidates --configs times where rows are not
16-byte aligned. No GPU, no torch kernels: the job list and its estimate only."""

from __future__ import annotations

import re
import sys
import types

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
sp = pytest.importorskip("sweep_plan")
import sweep_select as ss  # noqa: E402


def _part_args() -> types.SimpleNamespace:
    """The options sweep36b passes to sweep_logits.py, read from the script itself."""
    text = (ROOT / "benchmarks" / "h200_evidence.sh").read_text()
    part = text[text.index("  sweep36b)"):]
    part = part[: part.index(";;")].replace("\\\n", " ")
    line = next(line for line in part.splitlines() if "sweep_logits.py" in line)
    opt = lambda name: re.search(rf"--{name} (\S+)", line).group(1)  # noqa: E731
    return types.SimpleNamespace(vocab=opt("vocab"), control=opt("control"), configs_vocab=opt("configs-vocab"),
                                 no_launch="--no-launch" in line, configs="--configs " in line + " ",
                                 budget_s=float(opt("budget-s")))


def test_sweep36b_runs_the_two_vocabularies_and_the_control():
    args = _part_args()
    sel = ss.Selection.of(args)
    assert sel == ss.Selection((32000, 50257), ((128256, 8),), (32000, 50257), False)
    full = sp.jobs(False, args.configs)
    run = ss.select(full, sel)
    assert [j for j in full if j in run] == run  # the grid's priority order
    shapes = [j["shape"] for j in run if j["kind"] == "shape"]
    assert {s.vocab for s in shapes} == {32000, 50257, 128256}
    assert {(s.batch, s.seq) for s in shapes if s.vocab == 128256} == {(8, 1024), (8, 512)}
    assert all(s.batch == 8 for s in shapes if s.vocab == 128256)
    # every shape the full grid has at the two vocabularies
    assert {s for s in shapes if s.vocab != 128256} == {j["shape"] for j in full if j["kind"] == "shape"
                                                      and j["shape"].vocab in (32000, 50257)}
    configs = [j["shape"] for j in run if j["kind"] == "configs"]
    assert configs and {s.vocab for s in configs} == {32000, 50257}
    assert not any(j["kind"] == "launch" for j in run)


def test_sweep36b_fits_its_budget_by_the_sweeps_own_estimate():
    """About five minutes of device time: the estimate (prewarm included) within the part's budget, which
    stays under its KILL timeout."""
    args = _part_args()
    run = ss.select(sp.jobs(False, True), ss.Selection.of(args))
    for_level = ss.for_level(_configs())
    items = sp.prewarm_items(run, for_level)
    assert sp.estimate_total_s(run, 12, items) < args.budget_s <= 240


def _configs():
    """implementations/triton/configs.py as a module of its package (it imports launch)."""
    import importlib

    name = "grpo_impl_triton_sweep36b_test"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(ROOT / "implementations" / "triton")]
        sys.modules[name] = pkg
    return importlib.import_module(name + ".configs")


def test_unaligned_shapes_time_the_plain_kernels_beside_the_head_path():
    """Where V % 16 != 0, "shipped" is now the head/body/tail split; "no-head" (second) is the launch those
    shapes had before it, and the plain-* candidates switch staging off, or they would time the staged HEAD
    path again."""
    configs = _configs()
    fl = ss.for_level(configs)
    for (level, staged), names in fl.items():
        assert names[0] == "shipped" and all(n in configs.CANDIDATES for n in names)
        assert ("no-head" in names) == (not staged), (level, staged)
        if not staged:
            assert names[1] == "no-head" and names[2:] == configs.FOR_LEVEL[(level, staged)][1:]
    for name, choice in configs.CANDIDATES.items():
        assert (dict(choice.tuning).get("staged") is False) == name.startswith("plain"), name
        assert (dict(choice.tuning).get("head") is False) == (name == "no-head"), name
