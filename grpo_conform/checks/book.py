"""Collects per-call findings for each named check and turns them into one outcome per check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_conform.checks.registry import CHECKS_BY_NAME
from grpo_conform.isolation.session import WorkerFailure
from grpo_conform.results import INTERNAL_ERROR, CheckOutcome, Status


@dataclass(frozen=True)
class Finding:
    call: str
    status: Status
    message: str
    evidence: dict[str, Any]


@dataclass
class CheckBook:
    names: tuple[str, ...]
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    inapplicable: dict[str, str] = field(default_factory=dict)  # checks this member's semantics rule out
    internal: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # check -> grpo-conform's own error

    def __post_init__(self) -> None:
        for n in self.names:
            self.findings.setdefault(n, [])

    def record(self, check: str, call: str, ok: bool, message: str, evidence: dict[str, Any] | None = None) -> None:
        self.findings[check].append(Finding(call, "pass" if ok else "fail", message, evidence or {}))

    def failure(self, checks: tuple[str, ...], call: str, failure: WorkerFailure) -> None:
        """A call that raised, crashed or hung: `runs` fails, and each check needing the call errs."""
        status: Status = "timeout" if failure.kind == "timeout" else "error"
        evidence = failure.evidence()
        self.findings["runs"].append(Finding(call, status, f"call {call}: {failure}", evidence))
        for check in checks:
            if check != "runs":
                self.findings[check].append(Finding(call, status, f"call {call} did not complete: {failure}", {}))

    def skip_rest(self, reason: str) -> None:
        for n in self.names:
            if not self.findings[n]:
                self.skipped[n] = reason

    def skip(self, check: str, reason: str) -> None:
        if not self.findings[check]:
            self.skipped.setdefault(check, reason)  # the first reason is the specific one

    def internal_error(self, feeding: tuple[str, ...], message: str, info: dict[str, Any]) -> None:
        """grpo-conform raised (checks/internal.py): the checks the failing step was `feeding` and every
        check not judged yet are not judged, with the error; a check that already failed keeps its
        failure (a finding the error does not undo), one already skipped or ruled out its reason."""
        for n in self.names:
            failed = any(f.status != "pass" for f in self.findings[n])
            if n in self.inapplicable or failed or (n in self.skipped and not self.findings[n]):
                continue
            if n in feeding or not self.findings[n]:
                self.internal[n] = (message, info)

    def not_applicable(self, check: str, reason: str) -> None:
        """The member's semantics rule this check out: it is left out of the outcomes (so a record
        does not count it as skipped), with the reason kept in the workload's draws."""
        if not self.findings[check]:
            self.inapplicable[check] = reason

    def first_failure(self, among: tuple[str, ...] = ()) -> str | None:
        """The first check (in the book's order; of `among` where given) with a finding other than pass,
        informational ones aside."""
        return next((n for n in self.names if not CHECKS_BY_NAME[n].informational and (not among or n in among)
                     and any(f.status != "pass" for f in self.findings[n])), None)

    def marks(self) -> dict[str, int]:
        """How much each check holds so far (findings, a skip reason, an inapplicability): what a
        probe touched shows as a change between two marks."""
        return {n: len(self.findings[n]) + (n in self.skipped) + (n in self.inapplicable) for n in self.findings}

    def outcomes(self) -> tuple[CheckOutcome, ...]:
        out = []
        for name in self.names:
            if name in self.inapplicable:
                continue
            info = CHECKS_BY_NAME[name]
            found = self.findings[name]
            if name in self.internal:
                text, error = self.internal[name]
                judged = [{"call": f.call, "status": f.status, "message": f.message} for f in found]
                out.append(CheckOutcome(name, "skipped", text, {INTERNAL_ERROR: error, **({"calls": judged} if judged
                                                                                         else {})}, info.informational))
                continue
            if not found:
                reason = self.skipped.get(name, "not applicable to this run")
                out.append(CheckOutcome(name, "skipped", reason, {}, info.informational))
                continue
            bad = [f for f in found if f.status != "pass"]
            calls = [{"call": f.call, "status": f.status, "message": f.message} for f in found]
            if bad:
                first = next((f for f in bad if f.status == "timeout"), None) or bad[0]
                evidence = dict(first.evidence, calls=calls)
                named = next((f for f in bad if (f.evidence.get("likely_cause") or {}).get("matches")), None)
                if named is not None and named is not first:  # the diagnosis matched on a later failing call
                    evidence["likely_cause"] = dict(named.evidence["likely_cause"], call=named.call)
                out.append(CheckOutcome(name, first.status, first.message, evidence, info.informational))
            else:
                evidence = dict(found[0].evidence, calls=calls) if len(found) > 1 else dict(found[0].evidence)
                out.append(CheckOutcome(name, "pass", found[0].message, evidence, info.informational))
        return tuple(out)
