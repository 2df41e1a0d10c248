"""Result types of a check run: frozen dataclasses, serialized one way (`to_json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
    """One implementation against one resolved spec member (TEAM.md decision 8)."""

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
