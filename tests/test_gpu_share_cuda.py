"""Slots sharing one GPU through the gate (gate/gpu_share.py), end to end on CUDA: conformance under
memory grants, timing in each slot's exclusive turn, the ceilings measured there. Needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_conform.check import CheckRequest, run_check

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_two_slots_share_the_gpu_and_each_times_alone():
    request = CheckRequest((str(ROOT / "implementations" / "triton"),), device="cuda", jobs=2,
                           members=("token-is",), workloads=("seed-b2", "small-bf16", "odd-vocab", "drawn-bf16"))
    report = run_check(request)
    assert report.exit_code == 0, [(w.workload, [o.check for o in w.outcomes if o.failed])
                                   for i in report.implementations for w in i.workloads]
    assert len(report.parts) == 2 and any("to itself" in n for n in report.notes)
    workloads = {w.workload: w for i in report.implementations for w in i.workloads}
    assert all(w.draws["gpu_grant"]["bytes"] > 0 for w in workloads.values())  # every one under a grant
    peaks = [w.draws["gpu_grant"]["peak"] for w in workloads.values()]  # what each grant was spent on
    assert all(p["slot"] > 0 and p["worker"] > 0 for p in peaks), peaks
    seed = workloads["seed-b2"]
    assert {t["protocol"] for t in seed.timings} >= {"forward", "full"}  # timed, in the exclusive turn
    assert any(o.check == "timing-floor" and o.status == "pass" for o in seed.outcomes)
    timed_part = next(p for p in report.parts if any(w.timings for i in p.implementations for w in i.workloads))
    assert timed_part.hardware.get("ceilings")  # the ceilings its floors used, measured in its turn


def test_a_first_run_with_compile_ahead_and_shared_kernels_keeps_every_verdict(tmp_path, monkeypatch):
    """A first run (an empty compile store) of two slots with the compile-ahead worker (on by default)
    (check_ahead.py) and the kernels passed between running workers (isolation/live_share.py): every
    workload still passes, and the workers report what they received."""
    monkeypatch.setenv("GRPO_CONFORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GRPO_CONFORM_COMPILE_AHEAD", "1")
    request = CheckRequest((str(ROOT / "implementations" / "triton"),), device="cuda", jobs=2, timing=False,
                           members=("token-offpolicy-mask", "bnpo-mask", "dapo-mask", "cispo-mask"),
                           workloads=("mask-small-bf16", "mask-b1-long"))
    report = run_check(request)
    assert report.exit_code == 0, [(w.workload, [o.check for o in w.outcomes if o.failed])
                                   for i in report.implementations for w in i.workloads]
    caches = [p.implementations[0].worker.get("compile_cache") for p in report.parts]
    assert all(c and c.get("reused_files") == 0 for c in caches), caches  # a first run in both slots
