"""`grpo-conform check`: the request, the plan (implementations x spec members x workloads), the
run, the report.

The plan is made before anything runs (every manifest and spec checked first). Serial runs
happen here, in this process; `--jobs`/`--gpus` hand whole plans to slot processes
(grpo_conform.gate.parallel) and merge their reports. A hang ends its implementation at the first
timeout (the rest is reported as not run), so a hanging implementation costs one timeout.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.checks.probes import select as select_probes
from grpo_conform.checks.tamper import tamper_scan
from grpo_conform.checks.timed import TimingSettings, WorkloadTiming, skipped_timing, timing_failure_outcomes
from grpo_conform.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_OK, EXIT_USAGE, EnvironmentProblem
from grpo_conform.floors import compute_floor
from grpo_conform.gate.plan import ImplPlan, MemberPlan, Stop, build_plan
from grpo_conform.gate.progress import Progress, Reporter
from grpo_conform.hardware import Ceilings, GpuSpec, describe_running_gpu, measure_ceilings
from grpo_conform.inputs import fresh_seed
from grpo_conform.isolation.sandbox import preflight as sandbox_preflight
from grpo_conform.isolation.session import ImplementationLoadError, WorkerFailure, WorkerSession
from grpo_conform.provenance import device_info, software, utc_now
from grpo_conform.results import (STRICT_KINDS, CheckOutcome, Coverage, ImplementationResult, MemberResult, NotRun,
                                  WorkloadResult, implementation_status, worst_status)
from grpo_conform.spec import Spec

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
    fail_fast: bool = False  # -x: stop at the first failed workload
    strict: bool = False  # a skipped implementation, member or workload fails the run
    changed_since: str | None = None  # only the implementation folders changed since this git ref
    shard: tuple[int, int] | None = None  # (I, N), 1 <= I <= N: this machine's part of the work
    jobs: int = 1  # slot processes per device (GPU: capped at one when timing, see gate/parallel.py)
    gpus: str | tuple[int, ...] | None = None  # "all" or GPU indices: one slot (or `jobs`) per GPU
    units: tuple[tuple[str, str, str], ...] = ()  # internal (slots): only these (path, member, workload)
    extended: bool = False  # --extended: also the spec's extended-tier workloads
    sandbox: str = "none"  # --sandbox: "bwrap" runs every worker inside bubblewrap (isolation/sandbox.py)
    deadline: float | None = None  # --deadline: seconds from the start after which no workload starts
    explore: int = 0  # --explore N: N property-based cases per member after its workloads (explore.py)


@dataclass(frozen=True)
class CheckReport:
    device: dict[str, Any]
    interpreter: bool
    implementations: tuple[ImplementationResult, ...]
    specs: dict[str, Spec]
    started: str
    finished: str
    software: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)  # datasheet and measured ceilings (CUDA runs)
    strict: bool = False
    notes: tuple[str, ...] = ()  # what the gate selected and why (changed-since, shard, slots)
    shard: tuple[int, int] | None = None
    parts: tuple["CheckReport", ...] = ()  # --gpus/--jobs: the slot reports (each with its own device)

    @property
    def strict_failures(self) -> list[str]:
        """What --strict fails on: skipped implementations and members, workloads not run."""
        out = []
        if not self.implementations:  # issue 28: a gate that checked nothing (--changed-since) proves nothing
            out.append("no implementation was checked (--changed-since, --shard or --member selected none)")
        for impl in self.implementations:
            if impl.status == "skipped":
                out.append(f"{impl.name}: {impl.message}")
            for m in impl.members:
                if m.status == "skipped" and impl.status != "skipped":
                    out.append(f"{impl.name} {m.member}: {m.message}")
                out += [f"{impl.name} {m.member} {n.workload}: {n.reason}" for n in m.coverage.not_run
                        if n.kind in STRICT_KINDS]
        return out

    @property
    def exit_code(self) -> int:
        statuses = [i.status for i in self.implementations]
        if "load-error" in statuses:
            return EXIT_USAGE
        if "failed" in statuses:
            return EXIT_FAILED
        if self.strict and self.strict_failures:
            return EXIT_FAILED
        if statuses and all(s == "skipped" for s in statuses):
            return EXIT_ENVIRONMENT
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "grpo-conform",
            "started": self.started,
            "finished": self.finished,
            "device": self.device,
            "triton_interpreter": self.interpreter,
            "software": self.software,
            "hardware": self.hardware,
            "specs": [{"id": s.id, "version": s.version, "identity": {"sha256": s.identity}, "path": s.source,
                       "member": getattr(s, "member", None)} for s in self.specs.values()],
            "implementations": [i.to_json() for i in self.implementations],
            "strict": self.strict,
            "strict_failures": self.strict_failures if self.strict else [],
            "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
            "notes": list(self.notes),
            "parts": [{"device": p.device, "hardware": p.hardware, "started": p.started, "finished": p.finished,
                       "implementations": [i.path for i in p.implementations]} for p in self.parts],
            "exit_code": self.exit_code,
        }


@dataclass(frozen=True)
class RunContext:
    """What every implementation of one run shares: the device, its catalogue entry and ceilings."""

    device: torch.device
    timing: TimingSettings | None  # None: no timed protocols (CPU, or --no-timing)
    gpu: GpuSpec | None = None
    ceilings: Ceilings | None = None

    def floor_fn(self, spec: Spec, resolved):
        # traffic-v1 (docs/floors.md); `unmasked`: the mask (or its count) of the timed inputs
        return lambda protocol, unmasked=None: compute_floor(spec, resolved, protocol, self.gpu, self.ceilings,
                                                             unmasked=unmasked)


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
    largest = 0
    for w in workloads:
        rw = spec.resolve(w, random.Random(0))
        largest = max(largest, rw.numel("logits"))
    gigabytes = largest * 4 / 1e9
    return (180.0 if device.type == "cpu" else 120.0) + 60.0 * gigabytes


def run_check(request: CheckRequest, progress: Progress | None = None) -> CheckReport:
    stop = run_stop(request)  # --deadline counts from here: the planning and the bandwidth probe included
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
    if request.gpus is not None or request.jobs > 1:
        from grpo_conform.gate.parallel import run_slots

        return run_slots(request, plan, device, say, stop)
    started = utc_now()
    ctx, hardware = prepare_context(device, TimingSettings() if request.timing else None, say.line)
    results = tuple(check_implementation(p, ctx, request, say, stop) for p in plan.implementations)
    return CheckReport(device_info(device), device.type == "cpu", results, plan.specs, started, utc_now(), software(),
                       hardware, request.strict, plan.notes, request.shard)


def run_stop(request: CheckRequest) -> Stop:
    """The run's Stop, with --deadline counted from now."""
    return Stop(deadline=time.monotonic() + request.deadline if request.deadline is not None else None)


# -- one implementation ---------------------------------------------------------------------------
def _result(p: ImplPlan, members: list[MemberResult], worker: dict, status: str | None = None,
            message: str | None = None) -> ImplementationResult:
    impl = p.impl
    status = status or worst_status(m.status for m in members)
    if message is None:
        message = members[0].message if len(members) == 1 else "; ".join(f"{m.member}: {m.message}" for m in members)
    flat = tuple(w for m in members for w in m.workloads)
    return ImplementationResult(impl.name, str(impl.path), impl.identity, impl.manifest.model_dump(mode="json"),
                                status, message, flat, worker, tuple(members))  # type: ignore[arg-type]


def member_message(status: str, workloads, coverage: Coverage) -> str:
    if status == "failed":
        failed = sorted({o.check for w in workloads for o in w.outcomes if o.failed})
        return f"failed: {', '.join(failed)}"
    scope = "every workload" if not coverage.not_run else f"the checked workloads ({coverage.checked} of " \
                                                        f"{coverage.total})"
    checks = f" (checks: {', '.join(coverage.checks)})" if coverage.checks else ""
    return f"conformant on {scope}{checks}"


def _member(mp: MemberPlan, status: str, message: str, workloads=(), not_run: tuple[NotRun, ...] = (),
            checks: tuple[str, ...] = ()) -> MemberResult:
    cov = Coverage(tuple(w.workload for w in workloads), tuple(mp.not_run) + tuple(not_run), checks)
    if status == "":
        status = implementation_status(tuple(workloads))
        message = member_message(status, workloads, cov)
    return MemberResult(mp.spec, status, message, tuple(workloads), cov)  # type: ignore[arg-type]


def check_implementation(p: ImplPlan, ctx: RunContext, request: CheckRequest, say: Reporter,
                         stop: Stop) -> ImplementationResult:
    name = p.impl.name
    if p.skip:  # missing requirement, device not declared, no runnable workload: decided by the plan
        return _result(p, [_member(m, "skipped", p.skip) for m in p.members], {}, "skipped", p.skip)
    if stop.reason:
        members = [_member(m, "skipped", stop.reason, not_run=tuple(NotRun(w.name, stop.reason, "stopped")
                                                                   for w in m.workloads)) for m in p.members]
        return _result(p, members, {}, "skipped", stop.reason)
    worker_info: dict[str, Any] = {"triton_interpreter": ctx.device.type == "cpu"}
    done: list[MemberResult] = []
    ended: str | None = None  # why the rest of this implementation does not run (hang, load error)
    load_error: str | None = None
    for mp in p.members:
        if ended or stop.reason:
            why = ended or stop.reason
            kind = "hung" if ended else "stopped"
            done.append(_member(mp, "skipped" if not load_error else "load-error", load_error or why,
                                not_run=tuple(NotRun(w.name, why, kind) for w in mp.workloads)))
            continue
        timeout = request.timeout or default_timeout(mp.spec, mp.workloads, ctx.device)
        worker_info["timeout_s"] = timeout
        results: list[WorkloadResult] = []
        not_run: list[NotRun] = []
        session: WorkerSession | None = None
        try:
            for w in mp.workloads:
                if ended or stop.reason:
                    not_run.append(NotRun(w.name, ended or stop.reason or "", "hung" if ended else "stopped"))
                    continue
                if session is None or not session.alive:
                    if session is not None:
                        session.close()
                    say(name, mp.label, w.name, "starting worker")
                    session = WorkerSession(p.impl, mp.spec.parameter_values, ctx.device, timeout,
                                            ctx.device.type == "cpu", sandbox=request.sandbox)
                    try:
                        session.start()
                    except (ImplementationLoadError, WorkerFailure) as exc:
                        load_error = _load_message(p, exc)
                        ended = f"not run: the implementation did not load ({_first_line(load_error)})"
                        not_run.append(NotRun(w.name, ended, "hung"))
                        continue
                    worker_info.update(session.info)
                started = time.monotonic()
                result = run_workload(session, mp.spec, w, ctx, request, say, name, mp.label)
                results.append(result)
                hung = next((o for o in result.outcomes if o.status == "timeout"), None)
                bad = sorted({o.check for o in result.outcomes if o.failed})
                say(name, mp.label, w.name, f"{'FAILED ' + ', '.join(bad) if bad else 'passed'} "
                    f"({time.monotonic() - started:.1f} s)")
                if hung is not None:
                    ended = (f"not run: the implementation hung on {mp.label} {w.name} ({hung.check}: no answer "
                             f"within {timeout:g} s); a hang ends its implementation at the first timeout")
                if bad and request.fail_fast:
                    stop.reason = f"not run: --fail-fast stopped the run after {name} {mp.label} {w.name} failed"
            if request.explore and session is not None and session.alive and not (ended or stop.reason):
                from grpo_conform.explore import explore_workload
                from grpo_conform.gate.plan import select_outcomes

                say(name, mp.label, "explore", f"{request.explore} property-based cases")
                explored = explore_workload(session, mp.spec, request.explore, p.impl)
                results.append(replace(explored, outcomes=select_outcomes(explored.outcomes, request.checks)))
        finally:
            if session is not None:
                session.close()
        if load_error and not results:
            done.append(_member(mp, "load-error", load_error, not_run=tuple(not_run)))
        else:
            done.append(_member(mp, "", "", results, tuple(not_run), p.checks))
    worker_info.setdefault("timeout_s", request.timeout)
    if load_error and all(m.status in ("load-error", "skipped") for m in done):
        return _result(p, done, worker_info, "load-error", load_error)
    return _result(p, done, worker_info)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def _load_message(p: ImplPlan, exc: Exception) -> str:
    if isinstance(exc, ImplementationLoadError):
        return str(exc)
    tail = getattr(exc, "stderr_tail", "")
    return f"{p.impl.path / 'implementation.toml'}: field 'entry': loading failed: {exc}" + (f"\n{tail}" if tail else "")


def run_workload(session: WorkerSession, spec: Spec, w, ctx: RunContext, request: CheckRequest, say: Reporter,
                 name: str, member: str) -> WorkloadResult:
    """One workload of one member: the LEAD's conformance run, then the timed protocols (CUDA)."""
    from grpo_conform.gate.plan import resolve_checks, select_outcomes, wants_timing

    probes = select_probes(w.probes, resolve_checks(request.checks))  # -k narrows what runs, not only what shows
    resolved = spec.resolve(w, random.Random(secrets.randbits(64)))
    seeds = [fresh_seed() for _ in range(max(2, w.seeds))]
    draws: dict[str, Any] = {}
    say(name, member, w.name, f"conformance {list(resolved.shapes['logits'])}")
    outcomes = tuple(WorkloadConformance(session, spec, resolved, seeds, probes, w.probes, draws).run())
    outcomes += (tamper_scan(session.impl),)  # static, in the parent: the same on every workload
    timings: list = []
    timed: list[CheckOutcome] = []
    if wants_timing(request.checks):
        timings, timed = _time_workload(session, spec, w, resolved, ctx, say, name, member)
    kept = select_outcomes(outcomes + tuple(timed), request.checks)
    return WorkloadResult(w.name, resolved.axes, dict(resolved.dtypes), ctx.device.type, tuple(seeds), kept,
                          tuple(timings), draws)


def _time_workload(session: WorkerSession, spec: Spec, w, resolved, ctx: RunContext, say: Reporter, name: str,
                   member: str):
    # Timing checks are not applicable (so not listed) on the CPU or on workloads the spec does not time.
    if ctx.device.type != "cuda" or not w.timed:
        return [], []
    if ctx.timing is None:
        return [], skipped_timing("timing not requested (--no-timing)")
    if not session.alive:
        return [], skipped_timing("the worker was lost before timing")
    say(name, member, w.name, f"timing {', '.join(ctx.timing.protocols)}")
    try:
        return WorkloadTiming(session, spec, resolved, ctx.timing, ctx.floor_fn(spec, resolved)).run()
    except WorkerFailure as failure:
        return [], timing_failure_outcomes(failure)

