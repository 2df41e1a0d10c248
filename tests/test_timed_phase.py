"""The slot's exclusive turn (grpo_conform/timed_phase.py) without a GPU: which workloads run again
alone, and what a workload that could not gets. A verdict must never rest on memory other slots held,
and a faked out-of-memory message must gain nothing but a run alone."""

from __future__ import annotations

import types

from grpo_conform.gate.plan import Stop
from grpo_conform.isolation.session import ImplementationLoadError
from grpo_conform.results import INTERNAL_ERROR, CheckOutcome, WorkloadResult
from grpo_conform.timed_phase import Deferred, ran_out_of_memory, run_deferred

OOM = "call c1: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _result(*outcomes, draws=None) -> WorkloadResult:
    return WorkloadResult("mask-b8", {}, {}, "cuda", (), tuple(outcomes), (), dict(draws or {}))


def _entry(result, rerun=""):
    mp = types.SimpleNamespace(label="bnpo-mask", spec=None, workloads=())
    return Deferred(mp, [result], 0, types.SimpleNamespace(name="mask-b8", timed=True), None, (), rerun)


def test_out_of_memory_is_told_apart_from_other_failures():
    assert ran_out_of_memory(_result(CheckOutcome("runs", "error", OOM)))
    assert ran_out_of_memory(_result(CheckOutcome("loss", "skipped", "not judged: the validator ran out of GPU "
                                                                      "memory on this workload (CUDA out of memory)")))
    assert ran_out_of_memory(_result(draws={INTERNAL_ERROR: {"type": "OutOfMemoryError", "message": "x"}}))
    assert not ran_out_of_memory(_result(CheckOutcome("runs", "error", "call c1: RuntimeError: shape mismatch")))
    assert not ran_out_of_memory(_result(CheckOutcome("runs", "pass", "no out of memory here")))


def _run(entries, rerun, stop=None, start=lambda mp: types.SimpleNamespace(alive=True, close=lambda: None)):
    said = []
    impl = types.SimpleNamespace(name="impl")
    run_deferred(impl, entries, types.SimpleNamespace(device=None), None, lambda *a: said.append(a), start,
                 stop or Stop(), rerun)
    return said


def test_a_workload_short_of_memory_beside_others_is_judged_again_alone():
    entry = _entry(_result(CheckOutcome("runs", "error", OOM)), rerun="runs: " + OOM)
    _run([entry], lambda session, d: _result(CheckOutcome("runs", "pass", "every call returned")))
    final = entry.results[0]
    assert [o.status for o in final.outcomes] == ["pass"] and final.draws["rerun_alone"].startswith("runs")


def test_a_faked_out_of_memory_gains_only_a_run_alone():
    entry = _entry(_result(CheckOutcome("runs", "error", OOM)), rerun="runs: " + OOM)
    _run([entry], lambda session, d: _result(CheckOutcome("loss", "fail", "loss differs")))
    assert [(o.check, o.status) for o in entry.results[0].outcomes] == [("loss", "fail")]  # judged alone: fails


def test_a_workload_that_cannot_run_again_alone_is_not_judged_rather_than_failed():
    stopped = _entry(_result(CheckOutcome("runs", "error", OOM)), rerun="runs")
    _run([stopped], lambda session, d: None, stop=Stop("not run: --deadline reached"))
    assert {o.status for o in stopped.results[0].outcomes} == {"skipped"}
    assert "--deadline" in stopped.results[0].outcomes[0].message

    def no_worker(mp):
        raise ImplementationLoadError("impl/implementation.toml", "entry", "loading failed")

    lost = _entry(_result(CheckOutcome("runs", "error", OOM)), rerun="runs")
    _run([lost], lambda session, d: None, start=no_worker)
    assert {o.status for o in lost.results[0].outcomes} == {"skipped"}
    assert "did not start" in lost.results[0].draws["not_rerun"]
