"""Reduced probe profiles (huge CUDA workloads): only the slots their probes use are made, checks
outside the profile are skipped with the profile named, and a re-read with nothing kept is never a pass."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.checks.probes import select
from grpo_conform.implementations import load_implementation
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.spec import find_spec

ROOT = Path(__file__).resolve().parent.parent


def _run(profile: str, keep_budget: int | None = None):
    spec = find_spec("grpo/token-is")
    w = spec.workload("small-bf16").model_copy(update={"probes": profile})
    resolved = spec.resolve(w, random.Random(1))
    session = WorkerSession(load_implementation(ROOT / "implementations" / "pytorch"), spec.parameter_values,
                            torch.device("cpu"), 120.0, True)
    session.start()
    try:
        run = WorkloadConformance(session, spec, resolved, [11, 12], select(profile), profile)
        if keep_budget is not None:
            run.keep_budget = keep_budget
        outcomes = {o.check: o for o in run.run()}
        return run, outcomes
    finally:
        session.close()


def test_smoke_profile_makes_one_input_and_one_output_slot():
    run, outcomes = _run("smoke")
    assert run.extra_slots == []  # no Q, no O2: what lets a 16.8 GB workload fit next to its worker
    assert outcomes["gradient"].status == "pass" and outcomes["forward-only"].status == "pass"
    assert outcomes["upstream-gradient"].status == "skipped"
    assert "'smoke' probe profile" in outcomes["upstream-gradient"].message


@pytest.mark.slow  # ~12 s CPU: the core profile run twice through a worker
def test_core_profile_rereads_what_it_kept_and_skips_when_nothing_was_kept():
    run, outcomes = _run("core")
    assert set(run.extra_slots) == {"Q", "O2", "RCI", "RCO"}  # repeated-calls' own small shape
    assert outcomes["no-output-reuse"].status == "pass" and run.draws["kept_outputs"] >= 1
    run, outcomes = _run("core", keep_budget=0)
    assert run.draws["kept_outputs"] == 0
    assert outcomes["no-output-reuse"].status == "skipped"  # never a pass without evidence
    assert "could not be kept" in outcomes["no-output-reuse"].message


def test_validator_out_of_memory_skips_the_rest_instead_of_crashing(monkeypatch):
    """On the H200 a 62 GB temporary of the parent's once ended a whole run with a traceback (every
    earlier workload's evidence lost): now the workload says the validator ran out of memory."""
    from grpo_conform.checks import judging

    def boom(run, call):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 62.63 GiB.")

    monkeypatch.setattr(judging, "finite", boom)
    _run_, outcomes = _run("smoke")
    assert outcomes["gradient"].status == "skipped"
    assert "validator ran out of GPU memory" in outcomes["gradient"].message


def test_chunked_counts_and_differences_match_the_plain_ones():
    from grpo_conform import compare

    t = torch.randn(3, 5, 7)
    t[1, 2, 3] = float("nan")
    u = t.clone()
    u[2, 4, 6] = 0.5
    old = compare.CHUNK_ELEMENTS
    try:
        compare.CHUNK_ELEMENTS = 8  # many chunks
        assert compare.count_where(t, torch.isnan) == 1
        assert not compare.bitwise_equal(t, u) and compare.bitwise_equal(t, t.clone())
        d = compare.first_difference(u, t)
        assert d["differing"] == 1 and d["index"] == [2, 4, 6] and d["now"] == 0.5
    finally:
        compare.CHUNK_ELEMENTS = old
