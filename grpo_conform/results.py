"""Result types of a check run and their builders: frozen dataclasses, serialized one way (`to_json`).
The engine (check.py) and the gate (gate/parallel.py, gate/merge.py) both build them from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_conform.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_OK, EXIT_USAGE

Status = Literal["pass", "fail", "error", "timeout", "skipped"]
FAILING: frozenset[str] = frozenset({"fail", "error", "timeout"})


@dataclass(frozen=True)
class CheckOutcome:
    """The verdict of one named check on one workload, with the evidence behind it."""

    check: str
    status: Status
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    informational: bool = False

    @property
    def failed(self) -> bool:
        return self.status in FAILING and not self.informational

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "status": self.status, "message": self.message,
                               "evidence": self.evidence}
        if self.informational:
            out["informational"] = True
        return out


#: Checks that compare outputs with the float64 reference: once `loss` or `gradient` failed on a
#: workload, their reference mismatches repeat that root cause and judge nothing. advantage-sign,
#: last-row-ignored, no-output-reuse and gradient-row-sums are not here: they compare the
#: implementation's outputs with each other (or test an exact property), so a wrong gradient does
#: not explain their failure and they stay judged.
REFERENCE_DEPENDENT: frozenset[str] = frozenset({
    "freshness", "stale-output", "zero-advantage", "row-locality", "adversarial-inputs", "timed-outputs",
    "upstream-gradient", "non-leaf-logits", "interleaved-graphs", "input-layouts", "forward-only",
    "inference-mode", "retained-graph", "repeated-calls"})
LOSS_ONLY: frozenset[str] = frozenset({"forward-only", "inference-mode"})  # compares the loss alone
ROOT_CAUSES: tuple[str, ...] = ("loss", "gradient")
#: A workload's draws key, and its outcomes' evidence key: grpo-conform's own code raised while it
#: checked the workload (checks/internal.py). That workload judged nothing from then on; its member is
#: never conformant and the run exits 3 (a tool problem, not a finding about the implementation).
INTERNAL_ERROR = "internal_error"


def internal_error(w: Any) -> dict[str, Any] | None:
    """The internal error a workload result (or its JSON) records, or None."""
    draws = w.get("draws") if isinstance(w, dict) else getattr(w, "draws", None)
    return (draws or {}).get(INTERNAL_ERROR)


def not_judged(o: CheckOutcome) -> bool:
    """True for an outcome that `attribute_root_cause` set aside (status skipped, own verdict kept)."""
    return o.status == "skipped" and "not_judged" in o.evidence


def _explained_by(o: CheckOutcome, causes: list[str]) -> str | None:
    """The failed root cause (loss or gradient) that explains a failure of `o`, or None: `o` failed
    for a reason of its own (or did not fail)."""
    if o.status != "fail" or o.informational or o.check not in REFERENCE_DEPENDENT:
        return None
    e = o.evidence
    own = {"stale-output": bool(e.get("poison_hits") or e.get("gradient_nan")),  # poison left in the output
           "zero-advantage": bool(e.get("nonzero")),  # non-zero gradient where the advantage is 0
           "row-locality": bool(e.get("other_rows_changed")) or "did not change" in o.message,
           "inference-mode": bool(e.get("changes"))}.get(o.check, False)  # inputs written under inference_mode
    if own:
        return None
    g = e.get("gradient") if isinstance(e.get("gradient"), dict) else (e if "mismatches" in e else None)
    gradient_matched = g is not None and not (g.get("mismatches") or g.get("nan") or g.get("inf"))
    cause = "loss" if gradient_matched or o.check in LOSS_ONLY else "gradient"
    return cause if cause in causes else None


def attribute_root_cause(outcomes: tuple[CheckOutcome, ...]) -> tuple[CheckOutcome, ...]:
    """Post-processing over one workload's outcomes (the conformance sequence itself is untouched):
    when `loss` or `gradient` failed, a reference-dependent check whose failure that explains becomes
    "not judged", status `skipped` (so the evidence schema is unchanged), its own verdict kept under
    evidence.not_judged: it neither counts as a failure nor buries the root cause."""
    causes = [o.check for o in outcomes if o.check in ROOT_CAUSES and o.failed]
    runs = next((o for o in outcomes if o.check == "runs" and o.failed), None)
    if not causes and runs is None:
        return outcomes
    out = []
    for o in outcomes:
        if runs is not None and o is not runs and o.status in ("error", "timeout") and " did not complete: " in o.message:
            own = {"because": "runs", "status": o.status, "message": o.message}
            out.append(CheckOutcome(o.check, "skipped", "not judged: the call did not complete (see runs)",
                                    dict(o.evidence, not_judged=own), o.informational))
            continue
        which = _explained_by(o, causes)
        if which:
            own = {"because": which, "status": o.status, "message": o.message}
            o = CheckOutcome(o.check, "skipped", f"not judged: the {which} is already wrong (see {which})",
                             dict(o.evidence, not_judged=own), o.informational)
        out.append(o)
    return tuple(out)


@dataclass(frozen=True)
class WorkloadResult:
    workload: str
    axes: dict[str, int]
    dtypes: dict[str, str]
    device: str
    seeds: tuple[int, ...]
    outcomes: tuple[CheckOutcome, ...]
    timings: tuple[dict[str, Any], ...] = ()
    draws: dict[str, Any] = field(default_factory=dict)  # parameters, upstream scalars, ... the parent drew

    def __post_init__(self) -> None:
        # Every way a WorkloadResult is built gets the root-cause attribution (see attribute_root_cause).
        object.__setattr__(self, "outcomes", attribute_root_cause(tuple(self.outcomes)))

    @property
    def failed(self) -> bool:
        return any(o.failed for o in self.outcomes)

    def outcome(self, check: str) -> CheckOutcome | None:
        return next((o for o in self.outcomes if o.check == check), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "axes": self.axes,
            "dtypes": self.dtypes,
            "device": self.device,
            "seeds": [str(s) for s in self.seeds],
            "checks": [o.to_json() for o in self.outcomes],
            "timings": list(self.timings),
            **({"draws": self.draws} if self.draws else {}),
        }


ImplStatus = Literal["conformant", "failed", "skipped", "load-error"]
_WORST = ("load-error", "failed", "skipped", "conformant")  # the implementation's status: the worst member's

#: Why a workload did not run. `deselected` (--workload, --member, --shard) and `device` (the workload
#: does not run on this device) are choices or facts of the run; `skipped`, `stopped` (--fail-fast,
#: an interrupt) and `hung` (the implementation's first timeout ended it) are what --strict fails on
#: (`hung` and `stopped` follow a failure that already fails the run).
NotRunKind = Literal["deselected", "device", "skipped", "stopped", "hung", "elsewhere"]  # elsewhere: another
# shard or slot runs it (gone once merged; left only when that shard's report is missing)
STRICT_KINDS: frozenset[str] = frozenset({"skipped", "stopped", "hung"})


@dataclass(frozen=True)
class NotRun:
    workload: str
    reason: str
    kind: NotRunKind = "skipped"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "reason": self.reason, "kind": self.kind}


@dataclass(frozen=True)
class Coverage:
    """What one member's run covered: the workloads that ran, those that did not and why, and the
    checks reported (empty: all of them; else the -k/--check selection)."""

    run: tuple[str, ...] = ()
    not_run: tuple[NotRun, ...] = ()
    checks: tuple[str, ...] = ()

    @property
    def checked(self) -> int:
        return len(self.run)

    @property
    def total(self) -> int:
        return len(self.run) + len(self.not_run)

    @property
    def complete(self) -> bool:
        return not self.not_run and not self.checks

    def to_json(self) -> dict[str, Any]:
        return {"workloads_run": list(self.run), "workloads_not_run": [n.to_json() for n in self.not_run],
                "checked": self.checked, "total": self.total, "complete": self.complete,
                "checks_selected": list(self.checks)}


@dataclass(frozen=True)
class MemberResult:
    """One implementation against one resolved spec member (decision member-results, docs/decisions.md)."""

    spec: Any  # grpo_conform.spec.Spec (or grpo_conform.gate.merge.SpecRef in merged reports)
    status: ImplStatus
    message: str
    workloads: tuple[WorkloadResult, ...] = ()
    coverage: Coverage = Coverage()

    @property
    def member(self) -> str:
        return getattr(self.spec, "member", None) or self.spec.id

    def to_json(self) -> dict[str, Any]:
        return {"spec": {"id": self.spec.id, "version": self.spec.version, "identity": {"sha256": self.spec.identity},
                         "member": getattr(self.spec, "member", None)},
                "status": self.status, "message": self.message, "coverage": self.coverage.to_json(),
                "workloads": [w.to_json() for w in self.workloads]}


@dataclass(frozen=True)
class ImplementationResult:
    name: str
    path: str
    identity: str
    manifest: dict[str, Any]
    status: ImplStatus
    message: str
    workloads: tuple[WorkloadResult, ...] = ()  # flat view over every member's workloads
    worker: dict[str, Any] = field(default_factory=dict)
    members: tuple[MemberResult, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "identity": {"sha256": self.identity},
            "manifest": self.manifest,
            "status": self.status,
            "message": self.message,
            "worker": self.worker,
            "workloads": [w.to_json() for w in self.workloads],
            "members": [m.to_json() for m in self.members],
        }


def worst_status(statuses) -> ImplStatus:
    present = set(statuses)
    return next((s for s in _WORST if s in present), "conformant")  # type: ignore[return-value]


def implementation_status(workloads: tuple[WorkloadResult, ...]) -> ImplStatus:
    return "failed" if any(w.failed for w in workloads) else "conformant"


#: Outcomes that judge nothing the implementation computed: the static source scan is the same on
#: every workload and is recorded even when no call ran.
STATIC_CHECKS = frozenset({"tamper-scan"})


def judged(w: WorkloadResult) -> bool:
    """Whether a check judged a call of this workload (an outcome other than the static scan passed
    or failed); a workload whose checks were all skipped (worker lost, out of memory) judged nothing."""
    return any(o.check not in STATIC_CHECKS and (o.status == "pass" or o.failed) for o in w.outcomes)


def member_status(workloads) -> str:
    """failed if a workload failed; conformant only when at least one workload was judged; else
    skipped. A member none of whose workloads was judged (a --deadline or an interrupt stopped them,
    every one ran in another slot, every check was skipped) never reads as conformant: not in the
    table, the JSON, the summary line, the record or the exit code (issue 27, seen with --jobs on
    the H200)."""
    workloads = tuple(workloads)
    if any(w.failed for w in workloads):
        return "failed"
    if any(internal_error(w) for w in workloads):  # grpo-conform broke on one: no verdict, never a pass
        return "skipped"
    return "conformant" if any(judged(w) for w in workloads) else "skipped"


# -- builders (check.py's run, the gate's stopped and lost pieces) -----------------------------------
def implementation_result(p, members: list[MemberResult], worker: dict, status: str | None = None,
                          message: str | None = None) -> ImplementationResult:
    """The result of one planned implementation (`p`: a gate.plan.ImplPlan) from its members' results."""
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
    if status == "skipped" and any(internal_error(w) for w in workloads):
        w = next(w for w in workloads if internal_error(w))
        info = internal_error(w)
        return (f"not judged: grpo-conform hit an internal error on workload {w.workload} ({info['type']}: "
                f"{info['message'][:200]}); no verdict until it is fixed: please report it")
    if status == "skipped":
        why = next((n.reason for n in coverage.not_run if n.kind not in ("deselected", "device")), None)
        ran = len(tuple(workloads))
        return (f"not judged: none of its {coverage.total} workloads was judged"
                + (f" ({ran} ran, every check skipped)" if ran else "") + (f"; {why}" if why else ""))
    scope = "every workload" if not coverage.not_run else f"the checked workloads ({coverage.checked} of " \
                                                        f"{coverage.total})"
    checks = f" (checks: {', '.join(coverage.checks)})" if coverage.checks else ""
    return f"conformant on {scope}{checks}"


def member_result(mp, status: str, message: str, workloads=(), not_run: tuple[NotRun, ...] = (),
                  checks: tuple[str, ...] = ()) -> MemberResult:
    """One member's result (`mp`: a gate.plan.MemberPlan); status "" = from its workloads' outcomes."""
    cov = Coverage(tuple(w.workload for w in workloads), tuple(mp.not_run) + tuple(not_run), checks)
    if status == "":
        status = member_status(workloads)
        message = member_message(status, workloads, cov)
    return MemberResult(mp.spec, status, message, tuple(workloads), cov)  # type: ignore[arg-type]



@dataclass(frozen=True)
class CheckReport:
    device: dict[str, Any]
    interpreter: bool
    implementations: tuple[ImplementationResult, ...]
    specs: dict[str, Any]  # identity -> grpo_conform.spec.Spec (gate.merge.SpecRef in merged reports)
    started: str
    finished: str
    software: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)  # datasheet and measured ceilings (CUDA runs)
    strict: bool = False
    notes: tuple[str, ...] = ()  # what the gate selected and why (changed-since, shard, slots)
    shard: tuple[int, int] | None = None
    parts: tuple["CheckReport", ...] = ()  # --gpus/--jobs: the slot reports (each with its own device)
    phases: dict[str, Any] = field(default_factory=dict)  # where the wall time went (grpo_conform/phases.py)

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
    def internal_errors(self) -> list[str]:
        """Every workload on which grpo-conform itself raised: 'IMPL MEMBER WORKLOAD: TYPE: MESSAGE'."""
        out = []
        for impl in self.implementations:
            for label, workloads in ([(m.member, m.workloads) for m in impl.members] or [("", impl.workloads)]):
                for w in workloads:
                    info = internal_error(w)
                    if info:
                        where = " ".join(x for x in (impl.name, label, w.workload) if x)
                        out.append(f"{where}: {info['type']}: {info['message'][:200]}")
        return out

    @property
    def exit_code(self) -> int:
        statuses = [i.status for i in self.implementations]
        if self.internal_errors:  # grpo-conform itself failed on a workload: the run is no verdict (3)
            return EXIT_ENVIRONMENT
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
            "phases": self.phases,
        }



# -- reading our own JSON back (merge, parallel slots) ---------------------------------------------
def outcome_from_json(d: dict[str, Any]) -> CheckOutcome:
    return CheckOutcome(d["check"], d["status"], d["message"], dict(d.get("evidence") or {}),
                        bool(d.get("informational", False)))


def workload_from_json(d: dict[str, Any]) -> WorkloadResult:
    w = WorkloadResult(d["workload"], dict(d["axes"]), dict(d["dtypes"]), d["device"],
                       tuple(int(s) for s in d.get("seeds", ())), (), tuple(d.get("timings", ())))
    # outcomes set after construction: attribute_root_cause already ran where they were made
    object.__setattr__(w, "outcomes", tuple(outcome_from_json(o) for o in d.get("checks", ())))
    object.__setattr__(w, "draws", dict(d.get("draws") or {}))
    return w


def coverage_from_json(d: dict[str, Any]) -> Coverage:
    return Coverage(tuple(d.get("workloads_run", ())),
                    tuple(NotRun(n["workload"], n.get("reason", "not run"), n.get("kind", "skipped"))
                          for n in d.get("workloads_not_run", ())),
                    tuple(d.get("checks_selected", ())))
