"""A narrowed run never reads as a full verdict (issue 28 point 3).

`-k/--check`, `--workload`, `--member`, `--shard` (and the slots of `--jobs`) leave out checks,
workloads or members. This module is the one place that says what a result left out and whether
that makes it partial; the record's `selection` block, the closing verdict line, the JUnit report,
the Markdown summary and `verify --require-full-coverage` all read it from here.

Not a narrowing: workloads the spec does not run on this device, and the extended tier a run
without `--extended` or `--workload` leaves out; the record's `coverage` says those (a record with
any workload not run has `coverage.complete` false, which `partial_reason` also reports).
"""

from __future__ import annotations

from typing import Any

from grpo_conform.checks.registry import CHECKS_BY_NAME
from grpo_conform.errors import GrpoConformError


class SelectionError(GrpoConformError):
    """A --check, --member, --workload or --shard value that selects nothing or is malformed."""


EXTENDED_REASON = "an extended workload (run with --extended or --workload)"
WORKLOAD_REASON = "not selected (--workload)"
ALWAYS_REPORTED = ("runs",)  # a crash or a hang is never deselected by -k


def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def checks_left_out(selected: tuple[str, ...] | list[str], device_kind: str) -> list[str]:
    """The checks this device reports that a -k selection did not keep (none without -k)."""
    if not selected:
        return []
    return [n for n, c in CHECKS_BY_NAME.items()
            if n not in selected and n not in ALWAYS_REPORTED and (device_kind == "cuda" or not c.cuda_only)]


def workloads_left_out(coverage: Any) -> list[dict[str, str]]:
    """The member's workloads --workload, --shard or another slot took out of this result."""
    out = []
    for n in _get(coverage, "not_run", None) or _get(coverage, "workloads_not_run", None) or ():
        kind, reason = _get(n, "kind"), str(_get(n, "reason", ""))
        if kind == "elsewhere" or (kind == "deselected" and reason != EXTENDED_REASON):
            out.append({"workload": str(_get(n, "workload")), "reason": reason})
    return out


def members_left_out(impl: Any) -> list[str]:
    """The members the manifest declares that this result of the implementation does not hold
    (--member, or --workload naming none of their workloads)."""
    declared = [str(m) for m in (_get(impl, "manifest") or {}).get("members") or ()]
    ran = {getattr(m.spec, "member", None) or m.spec.id for m in _get(impl, "members", ()) or ()}
    return [m for m in declared if m not in ran]


def selection_block(report: Any, impl: Any, member: Any) -> dict[str, Any]:
    """The record's `selection`: what was selected, what that left out, and `partial`."""
    member = member if member is not None else impl  # a result of an older producer: the implementation's own
    coverage = _get(member, "coverage")
    checks = [str(c) for c in _get(coverage, "checks", ()) or ()]
    device_kind = str((report.device or {}).get("kind", ""))
    left = {"checks": checks_left_out(checks, device_kind), "workloads": workloads_left_out(coverage),
            "members": members_left_out(impl)}
    away = {w["workload"] for w in left["workloads"]}
    names = [w.workload for w in _get(member, "workloads", ())] + \
            [str(_get(n, "workload")) for n in _get(coverage, "not_run", ()) or ()]
    shard = getattr(report, "shard", None)
    return {
        "partial": bool(left["checks"] or left["workloads"] or left["members"]),
        "checks": checks or None,
        "workloads": [n for n in names if n not in away] if away else None,
        "members": [getattr(m.spec, "member", None) or m.spec.id for m in _get(impl, "members", ()) or ()]
        if left["members"] else None,
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "left_out": left,
    }


def describe(selection: dict[str, Any]) -> str:
    """'2 checks selected (25 left out), 6 workloads left out (...)': what a partial result lacks."""
    left = selection.get("left_out") or {}
    parts = []
    if left.get("checks"):
        parts.append(f"checks {', '.join(selection.get('checks') or ())} only ({len(left['checks'])} left out)")
    if left.get("workloads"):
        ws = [w["workload"] for w in left["workloads"]]
        parts.append(f"{len(ws)} workload(s) left out ({', '.join(ws[:4])}{', ...' if len(ws) > 4 else ''})")
    if left.get("members"):
        ms = left["members"]
        parts.append(f"{len(ms)} member(s) of the implementation were not run ({', '.join(ms[:4])}"
                     f"{', ...' if len(ms) > 4 else ''})")
    return "; ".join(parts)


def partial_reason(predicate: dict[str, Any]) -> str | None:
    """Why a record (its predicate) is not a full verdict, or None. Partial when `selection.partial`
    is true or `coverage.complete` is false (the rule the leaderboard applies too); a v1 record, which
    says nothing of its coverage, gives None: callers that need full coverage refuse it on their own."""
    selection = predicate.get("selection")
    if isinstance(selection, dict) and selection.get("partial"):
        return "partial: " + (describe(selection) or "narrowed by the run's selection")
    cov = predicate.get("coverage")
    if not isinstance(cov, dict):
        return None
    if not cov.get("complete", True):
        not_run = [w.get("workload", "?") for w in cov.get("workloads_not_run") or ()]
        text = f"covers {cov.get('checked')} of {cov.get('total')} workloads"
        if not_run:
            text += f" (not run: {', '.join(not_run[:5])}{', ...' if len(not_run) > 5 else ''})"
        if cov.get("checks_selected"):
            text += f"; only the checks {', '.join(cov['checks_selected'])}"
        return "partial: " + text
    if cov.get("members_not_run"):
        ms = [m.get("member", "?") for m in cov["members_not_run"]]
        return f"partial: {len(ms)} member(s) of the implementation were not run ({', '.join(ms[:5])})"
    return None


def report_partial(report: Any) -> str | None:
    """One line on what a check or merge report left out by its selection, or None when nothing was."""
    checks: set[str] = set()
    workloads = members = 0
    for impl in report.implementations:
        members += len(members_left_out(impl))
        for m in impl.members or ():
            checks.update(m.coverage.checks)
            workloads += len(workloads_left_out(m.coverage))
    device_kind = str((report.device or {}).get("kind", ""))
    parts = []
    if checks:
        left = len(checks_left_out(tuple(checks), device_kind))
        parts.append(f"-k: {len(checks)} of {len(checks) + left} checks reported")
    if workloads:
        parts.append(f"{workloads} workload(s) left out")
    if members:
        parts.append(f"{members} member(s) left out")
    return "PARTIAL (" + ", ".join(parts) + "): not a full verdict" if parts else None
