"""`grpo-conform bench`: time implementations on the spec's timed workloads with the harness of
grpo_conform.timing (through checks.timed, the same code `check` uses), with floor ratios and the
ratio to the first implementation named. Timings below their floor are rejected, never shown."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Any

from grpo_conform.check import Progress, RunContext, default_timeout, prepare_context, resolve_device
from grpo_conform.gate.plan import missing_requirements  # moved there by the gate (issue 15)
from grpo_conform.checks.timed import TimingSettings, WorkloadTiming
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, EnvironmentProblem
from grpo_conform.implementations import load_implementation
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.provenance import device_info, software, utc_now
from grpo_conform.spec import Spec, find_spec, load_spec


@dataclass(frozen=True)
class BenchRequest:
    paths: tuple[str, ...]
    protocols: tuple[str, ...] = ("full",)
    workloads: tuple[str, ...] = ()
    spec_path: str | None = None
    timeout: float | None = None
    reps: int = 20
    warmup: int = 3


@dataclass(frozen=True)
class BenchRow:
    implementation: str
    workload: str
    protocol: str
    status: str  # measured | rejected | failed | skipped
    message: str
    timing: dict[str, Any] | None = None
    failed_checks: tuple[str, ...] = ()
    ratio_to_first: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"implementation": self.implementation, "workload": self.workload, "protocol": self.protocol,
               "status": self.status, "message": self.message, "failed_checks": list(self.failed_checks),
               "ratio_to_first": self.ratio_to_first}
        if self.timing is not None:
            out["timing"] = self.timing
        return out


@dataclass(frozen=True)
class BenchReport:
    rows: tuple[BenchRow, ...]
    device: dict[str, Any]
    hardware: dict[str, Any]
    software: dict[str, Any]
    started: str
    finished: str
    spec: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if any(r.status in ("rejected", "failed") for r in self.rows) else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"tool": "grpo-conform bench", "started": self.started, "finished": self.finished,
                "device": self.device, "hardware": self.hardware, "software": self.software, "spec": self.spec,
                "rows": [r.to_json() for r in self.rows], "exit_code": self.exit_code}


def run_bench(request: BenchRequest, progress: Progress | None = None) -> BenchReport:
    say = progress or (lambda _m: None)
    device = resolve_device("auto")
    if device.type != "cuda":
        raise EnvironmentProblem("bench times CUDA kernels and this machine has no CUDA device; "
                                 "`grpo-conform check --device cpu` checks conformance without timing")
    impls = [load_implementation(p) for p in request.paths]
    spec = load_spec(request.spec_path) if request.spec_path else find_spec(impls[0].manifest.spec)
    chosen = (tuple(spec.workload(n) for n in request.workloads) if request.workloads
              else tuple(w for w in spec.workloads if w.timed and "cuda" in w.devices))
    settings = TimingSettings(protocols=request.protocols, reps=request.reps, warmup=request.warmup)
    started = utc_now()
    ctx, hardware = prepare_context(device, settings, say)
    draw = random.Random(secrets.randbits(64))
    resolved = {w.name: spec.resolve(w, draw) for w in chosen}
    rows: list[BenchRow] = []
    for impl in impls:
        rows += _bench_one(impl, spec, chosen, resolved, ctx, request, say)
    rows = _with_ratios(rows, impls[0].name if impls else "")
    return BenchReport(tuple(rows), device_info(device), hardware, software(), started, utc_now(),
                       {"id": spec.id, "version": spec.version, "identity": {"sha256": spec.identity}})


def _bench_one(impl, spec: Spec, workloads, resolved, ctx: RunContext, request: BenchRequest, say: Progress):
    missing = missing_requirements(impl)
    skip_reason = (f"needs {', '.join(missing)}, which is not installed" if missing else
                   None if "cuda" in impl.manifest.devices else "does not declare the cuda device")
    if skip_reason:
        return [BenchRow(impl.name, w.name, p, "skipped", skip_reason) for w in workloads for p in request.protocols]
    rows: list[BenchRow] = []
    timeout = request.timeout or default_timeout(spec, workloads, ctx.device)
    session: WorkerSession | None = None
    try:
        for w in workloads:
            if session is None or not session.alive:
                if session is not None:
                    session.close()
                session = WorkerSession(impl, spec.parameter_values, ctx.device, timeout)
                session.start()
            say(f"{impl.name}: {w.name}: timing {', '.join(request.protocols)}")
            rw = resolved[w.name]
            try:
                timings, outcomes = WorkloadTiming(session, spec, rw, ctx.timing, ctx.floor_fn(spec, rw),
                                                   ctx.gemm_ceiling_fn(spec, rw)).run()
            except WorkerFailure as failure:
                rows += [BenchRow(impl.name, w.name, p, "failed", str(failure)) for p in request.protocols]
                continue
            failed = tuple(o.check for o in outcomes if o.failed)
            for t in timings:
                below = t["below_floor"]
                status = "rejected" if below else ("failed" if failed else "measured")
                message = ("below the floor of its protocol: impossible, not published" if below
                           else t["summary"] + (f"; failed: {', '.join(failed)}" if failed else ""))
                rows.append(BenchRow(impl.name, w.name, t["protocol"], status, message,
                                     None if below else t, failed))
    finally:
        if session is not None:
            session.close()
    return rows


def _with_ratios(rows: list[BenchRow], first: str) -> list[BenchRow]:
    base = {(r.workload, r.protocol): r.timing["event"]["median_ns"] for r in rows
            if r.implementation == first and r.timing is not None}
    out = []
    for r in rows:
        ref = base.get((r.workload, r.protocol))
        ratio = (r.timing["event"]["median_ns"] / ref) if (ref and r.timing is not None) else None
        out.append(BenchRow(r.implementation, r.workload, r.protocol, r.status, r.message, r.timing,
                            r.failed_checks, ratio))
    return out
