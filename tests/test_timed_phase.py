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


def _result(*outcomes, draws=None, name="mask-b8") -> WorkloadResult:
    return WorkloadResult(name, {}, {}, "cuda", (), tuple(outcomes), (), dict(draws or {}))


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


# -- the engine's side of the gate (check.check_implementation), without a GPU -------------------------
class FakeGate:
    """Records what a slot asks the gate for, in order; grants at once (`try_exclusive` only with `last`:
    the slot is the last to finish its conformance)."""

    def __init__(self, last: bool = False):
        self.log: list[tuple[str, str, int, str]] = []
        self.held: set[int] = set()
        self._n = 0
        self.last = last

    def try_exclusive(self):
        self.log.append(("try", "exclusive", 0, ""))
        if not self.last:
            return 0
        self._n += 1
        self.held.add(self._n)
        return self._n

    def acquire(self, kind, nbytes=0, tag=""):
        self._n += 1
        self.held.add(self._n)
        self.log.append(("acquire", kind, nbytes, tag))
        return self._n

    def try_memory(self, nbytes):
        """Refused, so that every workload's memory is a queued `acquire` in the log (check._memory_hold)."""
        return 0

    def release(self, token):
        self.held.remove(token)
        self.log.append(("release", "", 0, ""))


class FakeSession:
    """A worker that records its steps in `log` (the gate's, so that they interleave with the holds): a full
    start, or a spawn (process only) and a load (the implementation's code) apart."""

    made: list["FakeSession"] = []
    log: list = []
    compile_cache_info: dict = {}  # seeded nothing known: never a first run (no compile-ahead worker)

    def __init__(self, impl, *args, **kwargs):
        self.impl, self.alive, self.info, self.timeout, self.closed = impl, True, {}, None, 0
        self.proc = types.SimpleNamespace(poll=lambda: None)  # running
        FakeSession.made.append(self)

    def _say(self, step):
        FakeSession.log.append((step, f"worker{FakeSession.made.index(self)}", 0, ""))

    def start(self):
        self._say("start")

    def spawn(self):
        self._say("spawn")

    def warm(self):
        self._say("warm")

    def load(self):
        self._say("load")

    def share_compiled(self):
        self._say("share")

    def close(self, graceful=True):
        self.alive = False
        self.closed += 1
        self._say("close")


def _slot_with_a_short_workload(monkeypatch, gate, stop=None):
    """check_implementation of pytorch's token-is (two workloads) as a slot beside others, through `gate`, with
    run_workload faked: odd-vocab runs out of memory beside the others, once. Returns (result, what ran, the
    sessions the runs alone were handed)."""
    from pathlib import Path

    import torch

    from grpo_conform import check
    from grpo_conform.checks.timed import TimingSettings
    from grpo_conform.gate.plan import build_plan
    from grpo_conform.gate.progress import Reporter

    root = Path(__file__).resolve().parents[1]
    request = check.CheckRequest((str(root / "implementations" / "pytorch"),), device="cpu", members=("token-is",),
                                 workloads=("small-bf16", "odd-vocab"))
    plan = build_plan(request, torch.device("cpu"))
    ran: list[str] = []
    alone: list = []

    def fake_run(session, spec, w, ctx, req, say, name, member, let_go=None):
        ran.append(w.name + (" alone" if ctx.gate is None else ""))
        if ctx.gate is None:
            alone.append(session)
        short = w.name == "odd-vocab" and ctx.gate is not None  # out of memory beside others, once
        outcome = CheckOutcome("runs", "error", OOM) if short else CheckOutcome("runs", "pass", "every call returned")
        draws = {}
        with check._memory_hold(ctx, 123, draws):
            pass
        return _result(outcome, draws=draws, name=w.name), object()

    monkeypatch.setattr(check, "run_workload", fake_run)
    monkeypatch.setattr(check, "WorkerSession", FakeSession)
    FakeSession.made, FakeSession.log = [], gate.log
    ctx = check.RunContext(torch.device("cpu"), TimingSettings(), gate=gate)
    result = check.check_implementation(plan.implementations[0], ctx, request, Reporter(None), stop or Stop())
    assert gate.log[0][:2] == ("acquire", "present") and gate.log[0][3] == plan.implementations[0].impl.identity
    return result, ran, alone


def test_a_slot_beside_others_holds_its_gpu_in_order_and_judges_a_short_workload_again_alone(monkeypatch):
    gate = FakeGate()
    result, ran, _ = _slot_with_a_short_workload(monkeypatch, gate)
    kinds = [(event, kind) for event, kind, _, _ in gate.log]
    assert kinds[0] == ("acquire", "present")
    # the conformance worker; two grants; the turn at once refused (another slot holds something); the worker
    # closed, present let go; the turn's worker spawned (no implementation code) while the turn is asked for
    # in the queue, loaded only once it is granted, closed before it is let go; then nothing held. A spawn
    # loaded before the grant, or a conformance worker left open into the wait, fails here.
    # Kernels pass between workers after each workload (WorkerSession.share_compiled), never in the turn.
    assert kinds[1:] == [("spawn", "worker0"), ("load", "worker0"), ("acquire", "memory"), ("release", ""), ("share", "worker0"),
                         ("acquire", "memory"), ("release", ""), ("share", "worker0"), ("try", "exclusive"),
                         ("close", "worker0"), ("release", ""),
                         ("spawn", "worker1"), ("warm", "worker1"), ("acquire", "exclusive"), ("load", "worker1"),
                         ("close", "worker1"), ("release", "")]
    assert not gate.held
    assert ran == ["small-bf16", "odd-vocab", "odd-vocab alone"]
    odd = next(w for w in result.workloads if w.workload == "odd-vocab")
    assert odd.draws["rerun_alone"].startswith("runs") and [o.status for o in odd.outcomes] == ["pass"]
    assert result.status == "conformant"


def test_a_turn_s_spawned_worker_that_a_stop_leaves_unused_is_closed_never_loaded(monkeypatch):
    """--deadline passes while the slot waits for its turn: the spawned worker is closed, and the
    implementation's code never entered it."""
    stop = Stop()

    class LateGate(FakeGate):
        def acquire(self, kind, nbytes=0, tag=""):
            if kind == "exclusive":
                stop.reason = "not run: --deadline reached"
            return super().acquire(kind, nbytes, tag)

    gate = LateGate()
    _slot_with_a_short_workload(monkeypatch, gate, stop)
    kinds = [(event, kind) for event, kind, _, _ in gate.log]
    assert kinds[-5:] == [("spawn", "worker1"), ("warm", "worker1"), ("acquire", "exclusive"), ("close", "worker1"),
                          ("release", "")]
    assert not gate.held


def test_the_last_slot_to_finish_times_at_once_in_its_conformance_worker(monkeypatch):
    """The gate's `try` granted (no other slot holds anything): the turn runs before the slot lets its
    presence go, in the worker its conformance ran in (no second start), which is closed once, by its owner."""
    gate = FakeGate(last=True)
    result, ran, alone = _slot_with_a_short_workload(monkeypatch, gate)
    kinds = [(event, kind) for event, kind, _, _ in gate.log]
    assert kinds[1:] == [("spawn", "worker0"), ("load", "worker0"), ("acquire", "memory"), ("release", ""), ("share", "worker0"),
                         ("acquire", "memory"), ("release", ""), ("share", "worker0"), ("try", "exclusive"),
                         ("release", ""), ("close", "worker0"),
                         ("release", "")]  # the turn, its worker closed, then presence let go
    assert not gate.held
    assert len(FakeSession.made) == 1 and FakeSession.made[0].closed == 1
    assert alone == [FakeSession.made[0]]  # the run alone was in the conformance worker
    odd = next(w for w in result.workloads if w.workload == "odd-vocab")
    assert odd.draws["rerun_alone"].startswith("runs") and result.status == "conformant"


def test_a_worker_that_does_not_start_in_the_turn_is_not_started_again():
    starts = []

    def no_worker(mp):
        starts.append(mp)
        raise ImplementationLoadError("impl/implementation.toml", "entry", "no answer within 120 s")

    timed = [_entry(_result(CheckOutcome("runs", "pass", "every call returned"))) for _ in range(3)]
    short = _entry(_result(CheckOutcome("runs", "error", OOM)), rerun="runs")
    _run(timed + [short], lambda session, d: None, start=no_worker)
    assert len(starts) == 1  # a hang at load costs one timeout, not one per deferred workload
    for entry in timed:
        timing = [o for o in entry.results[0].outcomes if o.check == "timing-floor"]
        assert timing and timing[0].status == "skipped" and "did not start" in timing[0].message
    assert {o.status for o in short.results[0].outcomes} == {"skipped"}


def test_every_timing_says_whether_it_ran_inline_or_in_the_exclusive_turn(monkeypatch):
    """A record's timings carry `timed_in`: a verifier can tell an exclusive turn's fresh worker from
    timing right after conformance. A wrong label (inline for a deferred workload) fails here."""
    from grpo_conform import timed_phase
    from grpo_conform.checks.timed import TimingSettings

    class StubTiming:
        held: list = []

        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            return [{"protocol": "forward"}, {"protocol": "full"}], [CheckOutcome("timing-floor", "pass", "above")]

    monkeypatch.setattr(timed_phase, "WorkloadTiming", StubTiming)
    monkeypatch.setattr(timed_phase, "release_cuda", lambda device: 0)  # no GPU here
    ctx = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), timing=TimingSettings(),
                                floor_fn=lambda spec, rw: None, gemm_ceiling_fn=lambda spec, rw: None)
    session = types.SimpleNamespace(alive=True, close=lambda: None)
    w = types.SimpleNamespace(name="mask-b8", timed=True)
    said = lambda *a: None  # noqa: E731
    inline, _ = timed_phase.time_workload(session, None, w, None, ctx, said, "impl", "bnpo-mask", {})
    assert [t["timed_in"]["where"] for t in inline] == ["inline", "inline"]

    entry = _entry(_result(CheckOutcome("runs", "pass", "every call returned")))
    run_deferred(types.SimpleNamespace(name="impl"), [entry], ctx, None, said, lambda mp: session, Stop(),
                 lambda session, d: None)
    timings = entry.results[0].timings
    assert [t["timed_in"] for t in timings] == [timed_phase.EXCLUSIVE_TURN] * 2
    assert [o.check for o in entry.results[0].outcomes][-1] == "timing-floor"

    # the last slot's conformance worker handed over (check.py): labelled so, and left open for its owner
    closed = []
    kept = types.SimpleNamespace(alive=True, close=lambda: closed.append("kept"))
    entry = _entry(_result(CheckOutcome("runs", "pass", "every call returned")))
    run_deferred(types.SimpleNamespace(name="impl"), [entry], ctx, None, said, lambda mp: kept, Stop(),
                 lambda session, d: None, reuse=kept)
    assert [t["timed_in"] for t in entry.results[0].timings] == [timed_phase.EXCLUSIVE_TURN_CONFORMANCE_WORKER] * 2
    assert closed == []
    # one that died: a fresh worker, labelled so and closed by the turn
    dead = types.SimpleNamespace(alive=False, close=lambda: closed.append("dead"))
    fresh = types.SimpleNamespace(alive=True, close=lambda: closed.append("fresh"))
    entry = _entry(_result(CheckOutcome("runs", "pass", "every call returned")))
    run_deferred(types.SimpleNamespace(name="impl"), [entry], ctx, None, said, lambda mp: fresh, Stop(),
                 lambda session, d: None, reuse=dead)
    assert [t["timed_in"] for t in entry.results[0].timings] == [timed_phase.EXCLUSIVE_TURN] * 2
    assert closed == ["fresh"]
