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


@dataclass(frozen=True)
class WorkloadResult:
    workload: str
    axes: dict[str, int]
    dtypes: dict[str, str]
    device: str
    seeds: tuple[int, ...]
    outcomes: tuple[CheckOutcome, ...]
    timings: tuple[dict[str, Any], ...] = ()

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
        }


ImplStatus = Literal["conformant", "failed", "skipped", "load-error"]


@dataclass(frozen=True)
class ImplementationResult:
    name: str
    path: str
    identity: str
    manifest: dict[str, Any]
    status: ImplStatus
    message: str
    workloads: tuple[WorkloadResult, ...] = ()
    worker: dict[str, Any] = field(default_factory=dict)

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
        }


def implementation_status(workloads: tuple[WorkloadResult, ...]) -> ImplStatus:
    return "failed" if any(w.failed for w in workloads) else "conformant"
