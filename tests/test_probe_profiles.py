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


def _run(profile: str, keep_budget: int | None = None, member: str = "grpo/token-is", workload: str = "small-bf16",
         probes: tuple | None = None, spy=None):
    spec = find_spec(member)
    w = spec.workload(workload).model_copy(update={"probes": profile})
    resolved = spec.resolve(w, random.Random(1))
    session = WorkerSession(load_implementation(ROOT / "implementations" / "pytorch"), spec.parameter_values,
                            torch.device("cpu"), 120.0, True)
    session.start()
    try:
        if spy is not None:
            spy(session)
        run = WorkloadConformance(session, spec, resolved, [11, 12], probes or select(profile), profile)
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


def test_the_layouts_set_is_let_go_after_its_probe_and_a_set_made_again_is_a_new_one():
    """V (layouts) is read by one probe: unbound in the worker and dropped here right after it, not at the
    workload's end, so K, made later by input-cases (and read again by trainer-shaped), can take its memory: a
    batch-8 workload's peak no longer holds both (docs/timing.md, "Thirty-third session"). The verdicts stay
    those of a run that kept it. A set let go and made again under its name is a new set to the reference cache:
    with (name, version) alone it got the released set's cached reference (its first version is 1 again), which
    this suite caught as a false gradient failure when K was let go too early."""
    from grpo_conform.checks.probes import PROBES_BY_NAME

    sent: list[tuple[str, tuple]] = []

    def spy(session):
        request = session.request

        def recorded(timeout=None, **msg):
            sent.append((msg.get("op"), tuple(msg.get("slots") or (msg.get("inputs"),))))
            return request(timeout, **msg)

        session.request = recorded

    names = ("baseline", "layouts", "input-cases", "trainer-shaped", "end-reread")
    run, outcomes = _run("full", member="grpo/token-offpolicy-mask", workload="mask-small-bf16",
                         probes=tuple(PROBES_BY_NAME[n] for n in names), spy=spy)
    # V, then VM once for each other mask dtype (the layouts probe's L-<dtype> calls), each let go after its call
    assert run.draws["released"] == ["V", "VM", "VM"] and "V" not in run.__dict__ and "V" not in run.extra_slots
    assert "VM" not in run.__dict__ and "VM" not in run.extra_slots
    v_unbound = sent.index(("unbind", ("V",)))
    k_forward = next(i for i, (op, inputs) in enumerate(sent) if op == "forward" and inputs == ("K",))
    assert v_unbound < k_forward  # V gone before K's first call
    for check in ("input-layouts", "gradient", "no-mutation", "no-output-reuse"):
        assert outcomes[check].status == "pass", (check, outcomes[check].message)
    old = run.slot_key(run.P)
    again = type(run.P)(run.P.name, {}, {}, version=run.P.version)  # the same name and version, another set
    assert run.slot_key(again) != old and run.slot_key(again)[::2] == old[::2]


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
