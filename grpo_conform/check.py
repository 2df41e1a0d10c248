"""`grpo-conform check`: the request, the plan (implementations x spec members x workloads), the
run, the report.

The plan is made before anything runs (every manifest and spec checked first). Serial runs
happen here, in this process; `--jobs`/`--gpus` hand whole plans to slot processes
(grpo_conform.gate.parallel) and merge their reports. A hang ends its implementation at the first
timeout (the rest is reported as not run), so a hanging implementation costs one timeout.

The Python API is this module, called: `grpo_conform.check(...)` (`check_paths`, at the end) runs
exactly what `grpo-conform check` runs and returns the `CheckReport`, printing and exiting nothing:

    import grpo_conform
    report = grpo_conform.check("implementations/triton", device="cpu", workloads=["odd-vocab"])
    report.exit_code                    # 0 conformant, 1 a check failed, 2 usage, 3 environment
    for impl in report.implementations:  # ImplementationResult: status, message, members, workloads
        print(impl.name, impl.status)
    report.to_json()                    # what --format json prints
"""

from __future__ import annotations

import math
import random
import secrets
import sys
import time
import types
from dataclasses import dataclass, field, replace
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch

from grpo_conform import check_ahead
from grpo_conform.checks import internal
from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.checks.probes import select as select_probes
from grpo_conform.checks.registry import CONFORMANCE_CHECKS, TIMING_CHECKS
from grpo_conform.checks.tamper import tamper_scan
from grpo_conform.checks.timed import TimingSettings
from grpo_conform import device_memory
from grpo_conform.errors import EnvironmentProblem
from grpo_conform.exploration import explore_workload
from grpo_conform.floors import compute_floor
from grpo_conform.gate.gpu_share import GateClient, GateError
from grpo_conform.gate.parallel import auto_jobs, run_slots
from grpo_conform.gate.plan import ImplPlan, Stop, build_plan, resolve_checks, select_outcomes, wants_timing
from grpo_conform.gate.selection import ALWAYS_REPORTED
from grpo_conform.gate.progress import Progress, Reporter
from grpo_conform import gemm_ceiling
from grpo_conform.hardware import Ceilings, GpuSpec, describe_running_gpu, measure_ceilings
from grpo_conform.isolation.sandbox import preflight as sandbox_preflight
from grpo_conform.ops import operation_for
from grpo_conform.ops.interface import fresh_seed
from grpo_conform.isolation.session import ImplementationLoadError, WorkerFailure, WorkerSession
from grpo_conform.phases import PHASES
from grpo_conform.sampler import sampling
from grpo_conform.provenance import device_info, software, utc_now
from grpo_conform.results import (INTERNAL_ERROR, CheckOutcome, CheckReport, ImplementationResult, MemberResult,
                                  NotRun, WorkloadResult, internal_error)
from grpo_conform.results import implementation_result as _result  # short names of the run loop below
from grpo_conform.results import member_result as _member
from grpo_conform.spec import Spec
from grpo_conform.timed_phase import Deferred, judged_timing, ran_out_of_memory, release_cuda, run_deferred

__all__ = ["CheckRequest", "CheckReport", "run_check", "resolve_device", "default_timeout"]


@dataclass(frozen=True)
class CheckRequest:
    paths: tuple[str, ...]
    device: str = "auto"
    workloads: tuple[str, ...] = ()
    spec_path: str | None = None
    timeout: float | None = None
    timing: bool = True
    members: tuple[str, ...] = ()  # --member: run only these members (names or ids)
    checks: tuple[str, ...] = ()  # -k/--check: report only these checks (names or fnmatch patterns)
    fail_fast: bool = False  # -x: stop at the first failed check: no later probe of its workload, no later workload
    strict: bool = False  # a skipped implementation, member or workload fails the run
    changed_since: str | None = None  # only the implementation folders changed since this git ref
    shard: tuple[int, int] | None = None  # (I, N), 1 <= I <= N: this machine's part of the work
    jobs: int = 1  # slot processes per device (GPU: capped at one when timing, see gate/parallel.py); 0: auto
    gpus: str | tuple[int, ...] | None = None  # "all" or GPU indices: one slot (or `jobs`) per GPU
    units: tuple[tuple[str, str, str], ...] = ()  # internal (slots): only these (path, member, workload)
    extended: bool = False  # --extended: also the spec's extended-tier workloads
    sandbox: str = "none"  # --sandbox: "bwrap" runs every worker inside bubblewrap (isolation/sandbox.py)
    deadline: float | None = None  # --deadline: seconds from the start after which no workload starts
    explore: int = 0  # --explore N: N property-based cases per member after its workloads (explore.py)
    shared_gpu: bool = False  # internal (slots): the GPU is shared through the run's gate (gate/gpu_share.py)


@dataclass(frozen=True)
class RunContext:
    """What every implementation of one run shares: the device, its catalogue entry and ceilings."""

    device: torch.device
    timing: TimingSettings | None  # None: no timed protocols (CPU, or --no-timing)
    gpu: GpuSpec | None = None
    ceilings: Ceilings | None = None
    # Slots sharing the GPU (gate/gpu_share.py): conformance under memory grants, timing deferred to
    # the slot's exclusive turn, where the ceilings are measured (into `hardware`).
    gate: GateClient | None = None
    hardware: dict = field(default_factory=dict)

    def floor_fn(self, spec: Spec, resolved):
        # traffic-v1 (docs/floors.md); `unmasked`: the mask (or its count) of the timed inputs
        return lambda protocol, unmasked=None: compute_floor(spec, resolved, protocol, self.gpu, self.ceilings,
                                                             unmasked=unmasked)

    def gemm_ceiling_fn(self, spec: Spec, resolved):
        """protocol -> the GEMM ceiling of its unavoidable GEMMs on this device (gemm_ceiling.py), or None."""
        op = operation_for(spec)

        def ceiling(protocol: str, values=None):
            gemms = op.gemms(spec, resolved, protocol)
            if not gemms:
                return None
            flops = sum(g.flops for g in gemms)
            peak = self.gpu.flops_per_s(gemms[0].dtype) if self.gpu is not None else None
            return gemm_ceiling.measure(gemms, self.device, flop_floor_ns=int(flops / peak * 1e9) if peak else None,
                                        values=values)

        return ceiling


def prepare_context(device: torch.device, timing: TimingSettings | None, say: Progress) -> tuple[RunContext, dict]:
    """On CUDA, measure the copy and read ceilings once per run, beside the datasheet figures."""
    if device.type != "cuda":
        return RunContext(device, None), {}
    say("measuring copy and read bandwidth")
    ceilings = measure_ceilings(device)
    running = describe_running_gpu(device, ceilings)
    return RunContext(device, timing, running.gpu, ceilings), running.to_json()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem("--device cuda: no CUDA device is available here (torch.cuda.is_available() is "
                                 "False); use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise EnvironmentProblem(f"unknown device {name!r}: expected auto, cpu or cuda")
    return torch.device(name)


def default_timeout(spec: Spec, workloads, device: torch.device) -> float:
    """Seconds a worker may take for one step (load, or one call): generous, scaled by the data."""
    largest, op = 0, operation_for(spec)
    for w in workloads:
        rw = spec.resolve(w, random.Random(0))
        largest = max(largest, op.workload_size(spec, rw).elements)
    gigabytes = largest * 4 / 1e9
    return (180.0 if device.type == "cpu" else 120.0) + 60.0 * gigabytes


def run_check(request: CheckRequest, progress: Progress | None = None) -> CheckReport:
    with sampling(PHASES):  # GRPO_CONFORM_SAMPLE=DIR: where this process's time goes (sampler.py)
        return _run_check(request, progress)


def _run_check(request: CheckRequest, progress: Progress | None) -> CheckReport:
    stop = run_stop(request)  # --deadline counts from here: the planning and the bandwidth probe included
    PHASES.reset()
    device = resolve_device(request.device)
    if device.type == "cpu":
        # The parent's tensors are small (one workload's reference, chunked) and it alternates with the
        # worker, which needs the other core: torch's second intra-op thread spins between ops and cost
        # 30x the CPU time of one thread on logsumexp of [56, 1536] float64 (measured 2026-12-02, load ~10).
        torch.set_num_threads(1)
    plan = build_plan(request, device)  # every manifest and spec checked before anything runs
    # --sandbox bwrap: bwrap present and able to start here, or nothing runs (never unsandboxed)
    sandbox_preflight(request.sandbox, device.type)
    say = Reporter(progress)
    if request.jobs == 0:
        request = replace(request, jobs=auto_jobs(plan, device.type, request.fail_fast))
    if request.gpus is not None or request.jobs > 1:
        return run_slots(request, plan, device, say, stop, check_implementation)
    started = utc_now()
    timing = TimingSettings() if request.timing else None
    if request.shared_gpu and device.type == "cuda":
        ctx = shared_context(device, timing)
        hardware = ctx.hardware  # filled once present, and by the slot's timed turn
    else:
        ctx, hardware = prepare_context(device, timing, say.line)
    results = tuple(check_implementation(p, ctx, request, say, stop) for p in plan.implementations)
    return CheckReport(device_info(device), device.type == "cpu", results, plan.specs, started, utc_now(), software(),
                       hardware, request.strict, plan.notes, request.shard, phases=PHASES.to_json())


def shared_context(device: torch.device, timing: TimingSettings | None) -> RunContext:
    """A slot's context on a GPU it shares through the run's gate: no ceilings yet (they are measured
    in the slot's exclusive turn, timed_phase.run_deferred)."""
    try:
        gate = GateClient.from_environment()
    except GateError as exc:
        raise EnvironmentProblem(f"this slot's GPU gate: {exc}") from None
    if gate is None:
        raise EnvironmentProblem("a slot sharing the GPU was started without the run's GPU gate (internal: "
                                 "the runner sets it; run `grpo-conform check` rather than the slot module)")
    return RunContext(device, timing, gate=gate)


def _first_cuda_work(ctx: RunContext) -> None:
    """A sharing slot's first CUDA work, once present: its CUDA context (made while another slot times,
    it would disturb the timing), the GPU's total memory for the gate, the GPU as the catalogue knows it
    (the ceilings measured in the slot's timed turn replace it)."""
    _free, total = torch.cuda.mem_get_info(ctx.device)
    assert ctx.gate is not None
    ctx.gate.report_total(total)
    if not ctx.hardware:
        ctx.hardware.update(describe_running_gpu(ctx.device, None).to_json())


def run_stop(request: CheckRequest) -> Stop:
    """The run's Stop, with --deadline counted from now."""
    return Stop(deadline=time.monotonic() + request.deadline if request.deadline is not None else None)


# -- one implementation ---------------------------------------------------------------------------
def check_implementation(p: ImplPlan, ctx: RunContext, request: CheckRequest, say: Reporter,
                         stop: Stop) -> ImplementationResult:
    if p.skip:  # missing requirement, device not declared, no runnable workload: decided by the plan
        return _result(p, [_member(m, "skipped", p.skip) for m in p.members], {}, "skipped", p.skip)
    if stop.reason:
        members = [_member(m, "skipped", stop.reason, not_run=tuple(NotRun(w.name, stop.reason, "stopped")
                                                                   for w in m.workloads)) for m in p.members]
        return _result(p, members, {}, "skipped", stop.reason)
    # One worker serves every member of the implementation: a start costs ~1.8 s of CPU (~10 s of
    # wall time on a loaded 2-core machine; torch and CUDA initialised again on a GPU), 11 of them
    # per implementation before. Conformance calls pass their parameters with every call; the timed
    # protocols get the member's declared values with `time_setup` (checks/timed.py).
    shared: list[WorkerSession] = []
    aheads: list[check_ahead.AheadCompiler] = []  # check_ahead.py: at most one
    deferred: list[Deferred] | None = [] if ctx.gate is not None else None
    present = None
    if ctx.gate is not None:
        with PHASES("gate-wait"):
            present = ctx.gate.acquire("present", tag=p.impl.identity)
    timed = False
    try:
        if present is not None and ctx.device.type == "cuda":
            _first_cuda_work(ctx)
        built = _check_members(p, ctx, request, say, stop, shared, deferred, aheads)
        for a in aheads:
            a.close()  # before the turn below: its worker may still be running calls on the GPU
            built[1]["compile_ahead"] = a.report()
        live = next((s for s in shared if s.alive), None)
        if deferred and present is not None and live is not None:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)  # none of this slot's own work queued when it asks
            # The last slot to finish conformance (or the first of slots finishing together) times at once,
            # in its conformance worker: no worker start, its kernels loaded (gate/gpu_share.py, `try`)
            with PHASES("gate-wait"):  # up to gpu_share.TRY_WAIT_S for slots finishing at the same moment
                token = ctx.gate.try_exclusive()
            if token:
                timed = True
                _timed_turn(p, ctx, request, say, deferred, stop, reuse=live, token=token)
    finally:
        for a in aheads:
            a.close()  # (closed above unless _check_members raised; closing twice is harmless)
        for s in shared:
            s.close()  # before a turn asked for in the queue: no worker of this slot is left on the GPU
        if present is not None:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            ctx.gate.release(present)
    if deferred and not timed:
        _timed_turn(p, ctx, request, say, deferred, stop)
    return _built_result(p, *built)


def _timed_turn(p: ImplPlan, ctx: RunContext, request: CheckRequest, say: Reporter,
                deferred: list[Deferred], stop: Stop, reuse: WorkerSession | None = None,
                token: int | None = None) -> None:
    """The slot's deferred timing, with the GPU to itself (timed_phase.py). `token`: the exclusive hold
    already granted (`try_exclusive`), with `reuse` the slot's conformance worker to time in while it lives."""
    assert ctx.gate is not None
    reruns = sum(1 for d in deferred if d.rerun)
    say.line(f"{p.impl.name}: {'the GPU to itself at once' if token else 'waiting for the GPU to itself'} to time "
             f"{len(deferred) - reruns} workloads"
             + (f" and run {reruns} again alone (out of memory beside other slots)" if reruns else ""))

    spawned: list[WorkerSession] = []  # the turn's first worker, spawned before the wait (loaded after it)

    def start_worker(mp) -> WorkerSession:
        if reuse is not None and reuse.alive:
            reuse.timeout = _timeout(request, mp, ctx)
            return reuse
        if spawned and not spawned[-1].alive:
            spawned.pop().close(graceful=False)  # it left while waiting: a fresh start below
        if spawned:
            session = spawned.pop()
            session.timeout = _timeout(request, mp, ctx)
            with PHASES("worker-start"):
                session.load()  # the implementation's code enters the process only now, under the hold
            return session
        session = _worker(p, ctx, request, mp)
        with PHASES("worker-start"):
            session.start()
        return session

    try:
        if token is None:
            _spawn_early(p, ctx, request, deferred, spawned)
            with PHASES("gate-wait"):
                token = ctx.gate.acquire("exclusive")
        _run_turn(p, ctx, request, say, deferred, stop, reuse, start_worker)
    finally:
        for session in spawned:  # never loaded (a stop, or no workload needed a worker)
            session.close()
        if token is not None:
            ctx.gate.release(token)


def _spawn_early(p: ImplPlan, ctx: RunContext, request: CheckRequest, deferred: list[Deferred],
                 spawned: list[WorkerSession]) -> None:
    """The turn's first worker spawned before the wait for the exclusive hold, loaded once it is granted
    (WorkerSession.spawn, .warm): a process start, torch's import and Triton's key pass while other slots
    time (its CUDA context is made after the grant: nothing of it touches the GPU before).
    It runs none of the implementation's code before its `load`, so it cannot help another slot's timed
    calls (docs/checks.md, "Slots sharing a GPU"). A spawn that fails leaves the start to the turn, where
    its error is reported as before."""
    mp = next((d.mp for d in deferred), None)
    if mp is None:
        return
    session = _worker(p, ctx, request, mp)
    try:
        with PHASES("worker-start"):
            session.spawn()
            session.warm()  # its imports while the slot waits; `load` reads the answer
    except Exception:
        session.close(graceful=False)
        return
    spawned.append(session)


def _timeout(request: CheckRequest, mp, ctx: RunContext) -> float:
    """A worker's per-call timeout for member plan `mp`: --timeout, else its workloads' default."""
    return request.timeout or default_timeout(mp.spec, mp.workloads, ctx.device)


def _worker(p: ImplPlan, ctx: RunContext, request: CheckRequest, mp) -> WorkerSession:
    """A worker for member plan `mp`, not yet started (conformance's, a timed turn's, the compile-ahead one)."""
    return WorkerSession(p.impl, mp.spec.parameter_values, ctx.device, _timeout(request, mp, ctx),
                         ctx.device.type == "cpu", sandbox=request.sandbox)


def _run_turn(p: ImplPlan, ctx: RunContext, request: CheckRequest, say: Reporter, deferred: list[Deferred],
              stop: Stop, reuse: WorkerSession | None, start_worker) -> None:
    """The turn under its exclusive hold: the ceilings measured, then every deferred workload timed."""
    timed_ctx, hardware = prepare_context(ctx.device, ctx.timing, say.line)
    ctx.hardware.update(hardware)

    def rerun(session: WorkerSession, d: Deferred) -> WorkloadResult:
        session.timeout = _timeout(request, d.mp, ctx)
        with PHASES.inclusive("workloads", f"{p.impl.name} {d.mp.label} {d.w.name} (alone)"):
            return run_workload(session, d.mp.spec, d.w, timed_ctx, request, say, p.impl.name, d.mp.label)[0]

    run_deferred(p.impl, deferred, timed_ctx, request, say, start_worker, stop, rerun, reuse)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _check_members(p: ImplPlan, ctx: RunContext, request: CheckRequest, say: Reporter, stop: Stop,
                   shared: list[WorkerSession], deferred: list[Deferred] | None, aheads: list):
    """Every member's workloads; returns what _built_result makes the implementation's result of (the
    members' workload lists stay open until then: deferred timing fills them in)."""
    name = p.impl.name
    worker_info: dict[str, Any] = {"triton_interpreter": ctx.device.type == "cpu"}
    done: list[MemberResult | tuple] = []  # a MemberResult, or (member plan, workload results, not run)
    ended: str | None = None  # why the rest of this implementation does not run (hang, load error)
    load_error: str | None = None
    ahead_tried = False  # the compile-ahead worker is tried at the first worker start only
    for index, mp in enumerate(p.members):
        if ended or stop.reason:
            why = ended or stop.reason
            kind = "hung" if ended else "stopped"
            done.append(_member(mp, "skipped" if not load_error else "load-error", load_error or why,
                                not_run=tuple(NotRun(w.name, why, kind) for w in mp.workloads)))
            continue
        timeout = _timeout(request, mp, ctx)
        worker_info["timeout_s"] = timeout
        results: list[WorkloadResult] = []
        not_run: list[NotRun] = []
        session: WorkerSession | None = shared.pop() if shared else None
        if session is not None:
            session.timeout = timeout
        try:
            for w in mp.workloads:
                if ended or stop.reason:
                    not_run.append(NotRun(w.name, ended or stop.reason or "", "hung" if ended else "stopped"))
                    continue
                if session is None or not session.alive:
                    if session is not None:
                        session.close()
                    say(name, mp.label, w.name, "starting worker")
                    session = _worker(p, ctx, request, mp)
                    early = None  # the compile-ahead worker, spawned beside this one (first start only)
                    try:
                        with PHASES("worker-start"):
                            session.spawn()
                            if not ahead_tried and deferred is not None:
                                ahead_tried = True
                                early = _spawn_ahead(p, ctx, request, session, index)
                            session.load()
                    except (ImplementationLoadError, WorkerFailure) as exc:
                        if early is not None:
                            early.close(graceful=False)
                        load_error = _load_message(p, exc)
                        ended = f"not run: the implementation did not load ({_first_line(load_error)})"
                        not_run.append(NotRun(w.name, ended, "hung"))
                        continue
                    worker_info.update(session.info)
                    if early is not None:
                        aheads += _begin_ahead(p, ctx, session, early, index)
                started = time.monotonic()
                with PHASES.inclusive("workloads", f"{name} {mp.label} {w.name}"):
                    result, resolved = run_workload(session, mp.spec, w, ctx, request, say, name, mp.label,
                                                    let_go=lambda: [a.let_go() for a in aheads])
                results.append(result)
                ahead_bytes = sum(a.held_bytes for a in aheads)  # the compile-ahead proxy's set while measured
                if ahead_bytes:  # (cuda_allocated_after): not a leak
                    result.draws["cuda_held_by_compile_ahead"] = ahead_bytes
                if deferred is not None and session is not None:  # slots sharing a GPU: kernels across workers
                    for ahead in aheads:
                        with PHASES("compile-ahead"):
                            ahead.step(index)
                    with PHASES("compile-share"):
                        session.share_compiled()
                short = ran_out_of_memory(result) if deferred is not None else ""
                if short:  # beside other slots: run it again alone in this slot's exclusive turn
                    deferred.append(Deferred(mp, results, len(results) - 1, w, resolved, request.checks, short))
                elif (deferred is not None and resolved is not None and w.timed and ctx.timing is not None
                      and wants_timing(request.checks)):
                    deferred.append(Deferred(mp, results, len(results) - 1, w, resolved, request.checks))
                held = memory_stop(result.draws, f"{name} {mp.label} {w.name}")
                if held and not stop.reason:
                    stop.reason = held
                    say(name, mp.label, w.name, held)
                hung = next((o for o in result.outcomes if o.status == "timeout"), None)
                bad = sorted({o.check for o in result.outcomes if o.failed})
                broke = internal_error(result)
                verdict = (f"FAILED {', '.join(bad)}" if bad else "passed") if not broke else (
                    f"NOT JUDGED: internal error of grpo-conform ({broke['type']})" + (f"; FAILED {', '.join(bad)}"
                                                                                       if bad else ""))
                say(name, mp.label, w.name, f"{verdict} ({time.monotonic() - started:.1f} s)")
                if broke and session is not None:
                    # grpo-conform raised mid-workload: the worker may hold calls or half a protocol exchange;
                    # the next workload gets a fresh one
                    session.close()
                    session = None
                if broke and cuda_context_lost(broke) and not stop.reason:
                    stop.reason = (f"not run: this process's CUDA context failed on {mp.label} {w.name} "
                                   f"({broke['message'].splitlines()[0][:120]}); every later CUDA call here would "
                                   f"raise the same error, so the run stops (please report it)")
                    say(name, mp.label, w.name, stop.reason)
                if hung is not None:
                    ended = (f"not run: the implementation hung on {mp.label} {w.name} ({hung.check}: no answer "
                             f"within {timeout:g} s); a hang ends its implementation at the first timeout")
                if bad and request.fail_fast:
                    stop.reason = f"not run: --fail-fast stopped the run after {name} {mp.label} {w.name} failed"
            if request.explore and session is not None and session.alive and not (ended or stop.reason):
                say(name, mp.label, "explore", f"{request.explore} property-based cases")
                try:
                    explored = explore_workload(session, mp.spec, request.explore, p.impl)
                    explored = replace(explored, outcomes=select_outcomes(explored.outcomes, request.checks))
                except Exception as exc:  # grpo-conform's own bug: see run_workload
                    if not internal.is_internal(exc):
                        raise
                    explored = _internal_result("explore", ctx, request, exc, ("runs", "loss", "gradient"))
                    session.close()  # the next member gets a fresh worker
                    session = None
                results.append(explored)
        finally:
            if session is not None and session.alive:
                shared.append(session)  # the next member's
            elif session is not None:
                session.close()
        if load_error and not results:
            done.append(_member(mp, "load-error", load_error, not_run=tuple(not_run)))
        else:
            done.append((mp, results, tuple(not_run)))
    worker_info.setdefault("timeout_s", request.timeout)
    return done, worker_info, load_error


def _spawn_ahead(p: ImplPlan, ctx: RunContext, request: CheckRequest, session: WorkerSession,
                 index: int) -> WorkerSession | None:
    """The slot's compile-ahead worker (check_ahead.py), spawned, on a first run of the identity only (the
    slot's worker, just spawned, seeded nothing from the store: `reused_files` 0); None elsewhere."""
    if not check_ahead.enabled() or session.compile_cache_info.get("reused_files") != 0:
        return None
    # a malformed setting is named before anything starts
    check_ahead.threads(), check_ahead.shapes(), check_ahead.once_calls_enabled(ctx.device)
    if not check_ahead.AheadCompiler.wanted(p.members, index):
        return None
    return check_ahead.AheadCompiler.spawn(lambda: _worker(p, ctx, request, p.members[index]))


def _begin_ahead(p: ImplPlan, ctx: RunContext, session: WorkerSession, early: WorkerSession,
                 index: int) -> list[check_ahead.AheadCompiler]:
    """The spawned compile-ahead worker loaded and sent its first request ([] if it did not begin); where it
    compiles the slot's first workload too (side by side at the workloads' shapes), the slot's worker takes those
    kernels from the store before that workload."""
    with PHASES("compile-ahead"):
        begun = check_ahead.AheadCompiler.begin(early, list(p.members), index, ctx.gate)
        if begun is None:
            return []
        if begun.settle_first(index):
            session.share_compiled()
    return [begun]


def _built_result(p: ImplPlan, done: list, worker_info: dict[str, Any], load_error: str | None) -> ImplementationResult:
    members = [m if isinstance(m, MemberResult) else _member(m[0], "", "", m[1], m[2], p.checks) for m in done]
    if load_error and all(m.status in ("load-error", "skipped") for m in members):
        return _result(p, members, worker_info, "load-error", load_error)
    return _result(p, members, worker_info)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def _load_message(p: ImplPlan, exc: Exception) -> str:
    if isinstance(exc, ImplementationLoadError):
        return str(exc)
    tail = getattr(exc, "stderr_tail", "")
    return f"{p.impl.path / 'implementation.toml'}: field 'entry': loading failed: {exc}" + (f"\n{tail}" if tail else "")


class ScaleDraw(random.Random):
    """Draws a ranged axis log-uniformly: every scale of the range is as likely (seq 1-9 as likely as
    9-80), every value stays reachable. A call's cost grows with batch x seq x vocab, so a uniform
    draw of drawn-bf16 (seq to 80, vocab to 40000) cost ~4x more on average and 10x more at its
    worst ([2, 72, 17353]) than the whole rest of token-is's CPU tier; the long rows and the large
    vocabulary have fixed workloads of their own (long-seq-cpu, mask-b1-long, real-vocab-cpu).
    docs/timing.md, "Validator time"."""

    def randint(self, a: int, b: int) -> int:  # type: ignore[override]
        if a < 1 or b <= a:
            return super().randint(a, b)
        return min(b, int(math.exp(self.uniform(math.log(a), math.log(b + 1)))))


def run_workload(session: WorkerSession, spec: Spec, w, ctx: RunContext, request: CheckRequest, say: Reporter,
                 name: str, member: str, let_go: Callable[[], None] | None = None) -> tuple[WorkloadResult, Any]:
    """One workload of one member: the LEAD's conformance run, then the timed protocols (CUDA; deferred
    where slots share the GPU). Returns the result and the resolved workload (None if it raised before).

    An exception of grpo-conform's own code (checks/internal.py) ends this workload only: the
    conformance run keeps what it judged before (WorkloadConformance.run), the timed protocols and
    anything else here report every check not judged; the workload's draws hold the error. `let_go`: what
    the slot must release before it waits at the gate for this workload's memory (_memory_hold)."""
    try:
        return _run_workload(session, spec, w, ctx, request, say, name, member, let_go)
    except Exception as exc:
        if not internal.is_internal(exc):
            raise
        checks = CONFORMANCE_CHECKS + (() if ctx.device.type != "cuda" or not w.timed else TIMING_CHECKS)
        return _internal_result(w.name, ctx, request, exc, checks), None


def cuda_context_lost(info: dict[str, Any]) -> bool:
    """An internal error that leaves this process's CUDA context unusable: torch's AcceleratorError (an illegal
    memory access, a launch failure: CUDA's sticky errors), after which every CUDA call of the process raises it.
    Other internal errors end their workload only."""
    return info.get("type", "").endswith("AcceleratorError")


def _internal_result(workload: str, ctx: RunContext, request: CheckRequest, exc: Exception,
                     checks: tuple[str, ...]) -> WorkloadResult:
    """A workload on which grpo-conform raised before it had outcomes of its own: `checks` not judged."""
    info = internal.describe(exc, f"workload {workload}")
    outcomes = select_outcomes(internal.outcomes(checks, info), request.checks)
    return WorkloadResult(workload, {}, {}, ctx.device.type, (), outcomes, (), {INTERNAL_ERROR: info})


def _stop_at(request: CheckRequest) -> tuple[str, ...] | None:
    """-x: the checks whose first failure ends the workload's probes (the selected ones and those always
    reported; () every check); None without -x."""
    if not request.fail_fast:
        return None
    names = resolve_checks(request.checks)
    return names + tuple(n for n in ALWAYS_REPORTED if n not in names) if names else ()


def _run_workload(session: WorkerSession, spec: Spec, w, ctx: RunContext, request: CheckRequest, say: Reporter,
                  name: str, member: str, let_go: Callable[[], None] | None = None) -> tuple[WorkloadResult, Any]:
    probes = select_probes(w.probes, resolve_checks(request.checks))  # -k narrows what runs, not only what shows
    resolved = spec.resolve(w, ScaleDraw(secrets.randbits(64)))
    seeds = [fresh_seed() for _ in range(max(2, w.seeds))]
    draws: dict[str, Any] = {}
    op = operation_for(spec)
    say(name, member, w.name, f"conformance {op.describe_workload(spec, resolved)}")
    grant = op.device_bytes(spec, resolved) if ctx.gate is not None else None
    with _memory_hold(ctx, grant, draws, let_go, session):
        outcomes = tuple(WorkloadConformance(session, spec, resolved, seeds, probes, w.probes, draws,
                                                     _stop_at(request)).run())
        with PHASES("scan"):
            outcomes += (tamper_scan(session.impl),)  # static, in the parent: the same on every workload
        timings: list = []
        timed: list[CheckOutcome] = []
        if ctx.gate is not None and ctx.timing is not None:
            pass  # timed in the slot's exclusive turn (timed_phase.run_deferred)
        elif wants_timing(request.checks) and INTERNAL_ERROR in draws:  # conformance raised: nothing timed either
            if ctx.device.type == "cuda" and w.timed:
                timed = list(internal.outcomes(TIMING_CHECKS, draws[INTERNAL_ERROR]))
        elif wants_timing(request.checks) and "stopped_at_failure" in draws:  # -x: a failed workload is not timed
            if ctx.device.type == "cuda" and w.timed:
                why = f"not run: --fail-fast stopped this workload when {draws['stopped_at_failure']['check']} failed"
                timed = [CheckOutcome(c, "skipped", why, {}) for c in TIMING_CHECKS]
        elif wants_timing(request.checks):
            timings, timed = judged_timing(session, spec, w, resolved, ctx, say, name, member, draws)
        kept = select_outcomes(outcomes + tuple(timed), request.checks)
        if ctx.device.type == "cuda":
            draws["cuda_allocated_after"] = release_cuda(ctx.device)
    return WorkloadResult(w.name, resolved.axes, dict(resolved.dtypes), ctx.device.type, tuple(seeds), kept,
                          tuple(timings), draws), resolved


@contextmanager
def _memory_hold(ctx: RunContext, grant: int | None, draws: dict[str, Any],
                 let_go: Callable[[], None] | None = None, session: WorkerSession | None = None) -> Iterator[None]:
    """Where slots share the GPU: the workload's grant held at the gate, and what it sizes by.

    A slot never waits in the gate's queue while it holds memory: its compile-ahead worker's proxies
    (check_ahead.py) hold a grant until their answer is collected. Waiting with it, behind a request that
    cannot fit beside it (seed-b17-big's on an H100), stalled every slot of round35c for good (thirty-first
    session). So the grant is tried at once first; refused, `let_go` collects that answer and releases its
    memory before the queued wait. The draws keep the grant, the wait and what the workload reserved here
    (device_memory.reserved_peak) and in the worker (its `memory_peak`): the measurements the grant's
    estimate is checked against (docs/timing.md)."""
    if ctx.gate is None or grant is None:
        yield
        return
    asked = time.monotonic()
    with PHASES("gate-wait"):
        token = ctx.gate.try_memory(grant)
        if not token:
            if let_go is not None:
                let_go()
            token = ctx.gate.acquire("memory", grant)
    draws["gpu_grant"] = {"bytes": grant, "waited_s": round(time.monotonic() - asked, 3)}
    try:
        cuda = ctx.device.type == "cuda"  # the gate's own tests hold grants on the CPU
        if cuda:
            device_memory.reset_peak(ctx.device)
        with device_memory.granted(grant):
            yield
        if cuda:
            # the worker's number is the implementation's process's word: read, never judged
            draws["gpu_grant"]["peak"] = {"slot": device_memory.reserved_peak(ctx.device),
                                          "worker": _worker_peak(session)}
    finally:
        ctx.gate.release(token)


def _worker_peak(session: WorkerSession | None) -> int | None:
    """The worker's reserved peak since its last ask; None where it is gone or cannot say."""
    if session is None or not session.alive:
        return None
    try:
        return session.request(op="memory_peak").get("reserved_peak")
    except WorkerFailure:  # its failure is the next request's to report
        return None


#: GPU memory grpo-conform's own process may still hold after a workload (it should hold next to none:
#: every buffer of a workload is its own). Past it the run stops (memory_stop).
LEAK_LIMIT = 4 << 30


def memory_stop(draws: dict[str, Any], where: str) -> str | None:
    """The run's stop reason when this process still holds more than LEAK_LIMIT after a workload. Past
    that, later workloads run out of memory in the worker, and an honest implementation fails `runs` for
    memory it never held (round30a on the H200: two members failed that way, docs/timing.md)."""
    after = draws.get("cuda_allocated_after")
    if after is None or after - draws.get("cuda_held_by_compile_ahead", 0) <= LEAK_LIMIT:
        return None
    held = draws.get("held_after_unbind", []) + draws.get("held_after_unbind_timed", [])
    why = (f"the worker still held {', '.join(held[:6])} after they were unbound" if held else
           "a leak of grpo-conform's own")
    return (f"not run: grpo-conform's process still held {after / 2**30:.1f} GiB of GPU memory after {where} ({why}); "
            "the rest is not run, so that no verdict blames an implementation for memory it never held: please report it")


# -- the Python API ------------------------------------------------------------------------------
def check_paths(*paths: str, device: str = "auto", workloads: Iterable[str] = (), spec: str | None = None,
                members: Iterable[str] = (), timing: bool = True, timeout: float | None = None,
                **options: Any) -> CheckReport:
    """Check implementation folders against their spec; returns the `CheckReport` (never exits).

    `spec`: a spec file overriding the manifests' spec; `workloads`/`members`: run only these; `timing`:
    time the protocols on CUDA; other keyword options are `CheckRequest` fields (e.g. fail_fast=True)."""
    if not paths:
        raise TypeError("grpo_conform.check() needs at least one implementation folder")
    request = CheckRequest(paths=tuple(str(p) for p in paths), device=device, workloads=tuple(workloads),
                           spec_path=spec, timing=timing, timeout=timeout, members=tuple(members), **options)
    return run_check(request)


class _CallableModule(types.ModuleType):
    """`grpo_conform.check(...)` calls `check_paths` while `grpo_conform.check` stays this module."""

    def __call__(self, *paths: str, **options: Any) -> CheckReport:
        return check_paths(*paths, **options)


sys.modules[__name__].__class__ = _CallableModule
