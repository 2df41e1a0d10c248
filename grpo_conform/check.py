"""`grpo-conform check`: the request, the run over implementations and workloads, the report."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.checks.timed import TimingSettings, WorkloadTiming, skipped_timing, timing_failure_outcomes
from grpo_conform.floors import compute_floor
from grpo_conform.hardware import Ceilings, GpuSpec, describe_running_gpu, measure_ceilings
from grpo_conform.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_OK, EXIT_USAGE, EnvironmentProblem
from grpo_conform.implementations import Implementation, load_implementation
from grpo_conform.inputs import fresh_seed
from grpo_conform.isolation.session import ImplementationLoadError, WorkerFailure, WorkerSession
from grpo_conform.provenance import device_info, software, utc_now
from grpo_conform.results import ImplementationResult, WorkloadResult, implementation_status
from grpo_conform.spec import Spec, find_spec, load_spec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CheckRequest:
    paths: tuple[str, ...]
    device: str = "auto"
    workloads: tuple[str, ...] = ()
    spec_path: str | None = None
    timeout: float | None = None
    timing: bool = True


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

    @property
    def exit_code(self) -> int:
        statuses = [i.status for i in self.implementations]
        if "load-error" in statuses:
            return EXIT_USAGE
        if "failed" in statuses:
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
            "specs": [{"id": s.id, "version": s.version, "identity": {"sha256": s.identity}, "path": s.source}
                      for s in self.specs.values()],
            "implementations": [i.to_json() for i in self.implementations],
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
        return lambda protocol: compute_floor(spec, resolved, protocol, self.gpu, self.ceilings)


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


def _spec_for(impl: Implementation, request: CheckRequest, cache: dict[str, Spec]) -> Spec:
    key = request.spec_path or impl.manifest.spec
    if key not in cache:
        cache[key] = load_spec(request.spec_path) if request.spec_path else find_spec(impl.manifest.spec)
    return cache[key]


def missing_requirements(impl: Implementation) -> list[str]:
    import importlib.util

    return [r for r in impl.manifest.requires if importlib.util.find_spec(r) is None]


def run_check(request: CheckRequest, progress: Progress | None = None) -> CheckReport:
    say = progress or (lambda _msg: None)
    device = resolve_device(request.device)
    impls = [load_implementation(p) for p in request.paths]  # every manifest checked before anything runs
    specs: dict[str, Spec] = {}
    plans = []
    for impl in impls:
        spec = _spec_for(impl, request, specs)
        chosen = tuple(spec.workload(n) for n in request.workloads) if request.workloads else spec.workloads_for(device.type)
        plans.append((impl, spec, chosen))
    started = utc_now()
    ctx, hardware = prepare_context(device, TimingSettings() if request.timing else None, say)
    results = tuple(_check_one(impl, spec, chosen, ctx, request, say) for impl, spec, chosen in plans)
    return CheckReport(device_info(device), device.type == "cpu", results,
                       {s.identity: s for s in specs.values()}, started, utc_now(), software(), hardware)


def _base_result(impl: Implementation, status: str, message: str, workloads=(), worker=None) -> ImplementationResult:
    return ImplementationResult(impl.name, str(impl.path), impl.identity, impl.manifest.model_dump(mode="json"),
                                status, message, tuple(workloads), worker or {})  # type: ignore[arg-type]


def _check_one(impl: Implementation, spec: Spec, workloads, ctx: RunContext, request: CheckRequest,
               say: Progress) -> ImplementationResult:
    device = ctx.device
    missing = missing_requirements(impl)
    if missing:
        return _base_result(impl, "skipped", f"needs {', '.join(missing)}, which is not installed "
                            f"(see {impl.path / 'implementation.toml'}: requires)")
    if device.type not in impl.manifest.devices:
        return _base_result(impl, "skipped", f"declares devices {list(impl.manifest.devices)}; this run is on "
                            f"{device.type}")
    runnable = [w for w in workloads if device.type in w.devices]
    if not runnable:
        return _base_result(impl, "skipped", f"no workload of spec {spec.id} runs on {device.type}")
    timeout = request.timeout or default_timeout(spec, runnable, device)
    interpret = device.type == "cpu"
    draw = random.Random(secrets.randbits(64))
    results: list[WorkloadResult] = []
    session: WorkerSession | None = None
    worker_info: dict[str, Any] = {"timeout_s": timeout, "triton_interpreter": interpret}
    try:
        for w in runnable:
            if session is None or not session.alive:
                if session is not None:
                    session.close()
                say(f"{impl.name}: starting worker")
                session = WorkerSession(impl, spec.parameter_values, device, timeout, interpret)
                try:
                    session.start()
                except ImplementationLoadError as exc:
                    session.close()
                    return _base_result(impl, "load-error", str(exc), results, worker_info)
                except WorkerFailure as exc:
                    session.close()
                    return _base_result(impl, "load-error", f"{impl.path / 'implementation.toml'}: field 'entry': "
                                        f"loading failed: {exc}\n{exc.stderr_tail}", results, worker_info)
                worker_info.update(session.info)
            resolved = spec.resolve(w, draw)
            seeds = [fresh_seed() for _ in range(max(2, w.seeds))]
            say(f"{impl.name}: {w.name} {resolved.shapes['logits']}")
            outcomes = WorkloadConformance(session, spec, resolved, seeds).run()
            timings, timed_outcomes = _time_workload(session, spec, w, resolved, ctx, say, impl.name)
            results.append(WorkloadResult(w.name, resolved.axes, dict(resolved.dtypes), device.type,
                                          tuple(seeds), outcomes + tuple(timed_outcomes), tuple(timings)))
    finally:
        if session is not None:
            session.close()
    status = implementation_status(tuple(results))
    failed = sorted({o.check for r in results for o in r.outcomes if o.failed})
    message = "conformant on every workload" if status == "conformant" else f"failed: {', '.join(failed)}"
    return _base_result(impl, status, message, results, worker_info)


def _time_workload(session: WorkerSession, spec: Spec, w, resolved, ctx: RunContext, say: Progress, name: str):
    # Timing checks are not applicable (so not listed) on the CPU or on workloads the spec does not time.
    if ctx.device.type != "cuda" or not w.timed:
        return [], []
    if ctx.timing is None:
        return [], skipped_timing("timing not requested (--no-timing)")
    if not session.alive:
        return [], skipped_timing("the worker was lost before timing")
    say(f"{name}: {w.name}: timing {', '.join(ctx.timing.protocols)}")
    try:
        return WorkloadTiming(session, spec, resolved, ctx.timing, ctx.floor_fn(spec, resolved)).run()
    except WorkerFailure as failure:
        return [], timing_failure_outcomes(failure)
