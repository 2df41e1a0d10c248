"""The audit's data: a reported record as read from either input form, the findings about it and the
audited record (grpo_conform/audit.py reads and judges; audit_fused.py, audit_against.py and
audit_repro.py add the fused-linear judgement, the cross-reference with Liger-Kernel's own CSV and
the reproduction from our H200 records). Kept apart so those modules need not import audit.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from grpo_conform.floors import ITEMSIZE, Floor
from grpo_conform.hardware import GpuMatch
from grpo_conform.spec import Spec, Workload


@dataclass(frozen=True)
class Record:
    """A reported timing, normalized from either input form."""

    where: str
    implementation: str
    provider: str
    operation: str
    protocol: str
    axes: dict[str, int]
    dtype: Optional[str]
    gpu: str
    median_ms: float
    quantiles_ms: dict[str, float] = field(default_factory=dict)
    source: str = ""
    observed: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.axes.items())
        return (f"{self.where}: {self.implementation} {self.operation} ({self.protocol}) [{shape}, "
                f"{self.dtype or 'dtype?'}] on {self.gpu}: {self.median_ms:g} ms")


@dataclass(frozen=True)
class IgnoredRow:
    where: str
    reason: str


@dataclass(frozen=True)
class Finding:
    check: str  # gpu | operation | workload | protocol | physics | quantiles | source-row
    status: str  # ok | warning | mismatch | unknown | impossible | skipped
    message: str


@dataclass(frozen=True)
class RecordAudit:
    record: Record
    verdict: str
    findings: tuple[Finding, ...]
    comparable: bool = True  # same operation, protocol (forward or full) and workload as the spec
    gpu: Optional[GpuMatch] = None
    workload: Optional[str] = None
    floor: Optional[Floor] = None
    floor_ratio: Optional[float] = None
    # Set for a record judged against another spec than the report's (a fused-linear row: audit_fused.py)
    spec_id: Optional[str] = None
    summary: str = ""  # what was timed, in words (the fused-linear verdict line's text)
    reproduction: Any = None  # audit_repro.Reproduction: what our own records measured for this row

    def finding(self, check: str) -> Optional[Finding]:
        return next((f for f in self.findings if f.check == check), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{f.check}: {f.message}" for f in self.findings if f.status not in ("ok",))

    def to_json(self) -> dict[str, Any]:
        return {"record": asdict(self.record), "verdict": self.verdict, "comparable": self.comparable,
                "findings": [asdict(f) for f in self.findings],
                "gpu": self.gpu.to_json() if self.gpu else None, "workload": self.workload,
                "floor": self.floor.to_json() if self.floor else None, "floor_ratio": self.floor_ratio,
                "spec": self.spec_id, "summary": self.summary or None,
                "reproduction": self.reproduction.to_json() if self.reproduction is not None else None}

    def lines(self) -> list[str]:
        head = f"{self.record.label()} -> {self.verdict}" + ("" if self.comparable else ", not comparable")
        out = [head] + ([f"    {self.summary}"] if self.summary else [])
        out += [f"    {f.check}: {f.status}: {f.message}" for f in self.findings]
        return out + ([f"    {line}" for line in self.reproduction.lines()] if self.reproduction is not None else [])


def match_workload(record: Record, spec: Spec) -> tuple[Finding, Optional[Workload]]:
    x = spec.differentiable_input
    for w in spec.workloads:
        if not w.drawn and all(record.axes.get(a) == v for a, v in w.axes.items()) \
                and record.dtype == w.dtypes.get(x.name):
            return Finding("workload", "ok", f"matches the spec's workload {w.name!r}"), w
    base = [a.name for a in spec.axes if a.derivation() is None]
    missing = [a for a in base if a not in record.axes]
    stated = ", ".join(f"{k}={v}" for k, v in record.axes.items()) + f", {x.name} {record.dtype or 'dtype not stated'}"
    why = f"axes {', '.join(missing)} not stated" if missing else "no fixed workload of the spec has these values"
    extra = f"; {', '.join(f'{k}={v}' for k, v in record.extra.items())} not part of the spec" if record.extra else ""
    if missing or (record.dtype is not None and record.dtype not in x.dtypes):
        return Finding("workload", "mismatch", f"{stated}: {why}{extra}"), None
    dtype = record.dtype or min(x.dtypes, key=lambda d: ITEMSIZE.get(d, 99))  # unstated: smallest, a lower bound
    synthetic = Workload(name="reported", axes={a: record.axes[a] for a in base}, dtypes={x.name: dtype},
                         devices=("cuda",))
    return Finding("workload", "mismatch", f"{stated}: {why}{extra}"), synthetic
