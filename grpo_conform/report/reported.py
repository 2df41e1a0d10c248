"""Third-party records (nobody here measured them) shown beside the evidence, each with what the
audit says of it, in one of four words, each with its meaning spelled out on the page:

- impossible:     faster than the DRAM floor of the operation it claims on that GPU; not a valid
                  time of that operation, whatever else is true of it;
- not comparable: physically possible, but not a time of the spec's operation under one of its
                  protocols and workloads (another operation, backward-only, other shapes);
- plausible:      possible, and the same operation, protocol and workload: comparable, still
                  unverified (no signed record, not reproduced);
- unknown GPU:    the GPU is not in the catalogue, so no floor can be set.
An impossible record is also said to be comparable or not, in its explanation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_conform.audit import AuditRequest, RecordAudit, run_audit

MEANINGS = {
    "impossible": "faster than the DRAM floor of the operation it claims on that GPU: not a valid time of it",
    "not comparable": "physically possible, but not a time of the spec's operation under one of its protocols "
                      "and workloads (another operation, backward-only timing, or other shapes)",
    "plausible": "possible, same operation, protocol and workload: comparable, but unverified (no signed record)",
    "unknown GPU": "the GPU is not in the catalogue: no floor can be set, nothing can be judged",
}


def label(a: RecordAudit) -> str:
    """The one word shown for an audited record (see MEANINGS)."""
    if a.verdict == "impossible":
        return "impossible"
    if a.verdict == "unknown-gpu":
        return "unknown GPU"
    return "plausible" if a.comparable else "not comparable"


def explanation(a: RecordAudit) -> str:
    """Why: the findings that decide the label, physics first."""
    decisive = [f for f in a.findings if f.status in ("impossible", "mismatch", "unknown")]
    if getattr(a, "summary", ""):  # a fused-linear row: what it timed (its protocol in words) comes first
        decisive = [f for f in decisive if f.check != "protocol"]
    decisive.sort(key=lambda f: 0 if f.status == "impossible" else 1)
    text = "; ".join(f"{f.check}: {f.message}" for f in decisive)
    if a.verdict == "impossible":
        text += "; " + ("otherwise comparable" if a.comparable else "also not comparable (see above)")
    physics = a.finding("physics")
    if not decisive and physics is not None:
        text = physics.message
    if getattr(a, "summary", ""):
        text = f"{a.summary}; {text}" if text else a.summary
    return text


@dataclass(frozen=True)
class ReportedRow:
    source_file: str
    where: str
    implementation: str
    provider: str
    operation: str
    protocol: str
    gpu: str
    workload: str | None
    shape: str
    median_ms: float
    observed: str
    label: str
    comparable: bool
    floor_ms: float | None
    floor_ratio: float | None
    explanation: str
    audited_against: str = ""  # the spec this row was judged against (fused lm_head rows: grpo-fused-linear/...)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def audit_reported(files: tuple[str, ...], spec: str = "grpo-token-is", against: str | None = None) -> list[ReportedRow]:
    """Each reported file audited as `grpo-conform audit --spec SPEC [--against FILE]` would; every row
    names the spec it was judged against (rows of the fused lm_head kernel: the fused-linear spec)."""
    rows = []
    for file in files:
        report = run_audit(AuditRequest(path=file, spec=spec, against=against))
        for a in report.audits:
            r = a.record
            shape = " x ".join(f"{k} {v}" for k, v in r.axes.items()) + (f", {r.dtype}" if r.dtype else "")
            gpu = a.gpu.gpu.name if a.gpu is not None else r.gpu
            floor_ms = round(a.floor.floor_ns / 1e6, 9) if a.floor is not None else None
            ratio = a.floor_ratio if a.floor_ratio is not None and math.isfinite(a.floor_ratio) else None
            rows.append(ReportedRow(file, r.where, r.implementation, r.provider, r.operation, r.protocol, gpu,
                                    a.workload, shape, r.median_ms, r.observed, label(a), a.comparable, floor_ms,
                                    round(ratio, 4) if ratio is not None else None,
                                    explanation(a), a.spec_id or report.spec.id))
    return rows
