"""When a record covers less than its spec member: one rule, shared by `verify`, `report` and `merge`.

A record is partial when its coverage block says it is not complete (workloads or checks were left
out) or when the run's `selection` block says the run was narrowed (`partial: true`). Records
without either block (predicate v1) are taken as they say: not partial.

The leaderboard ranks per workload, so a record that ran some workloads in full can still rank on
those; what it cannot rank is a workload whose checks were narrowed (`checks_narrowed`).
"""

from __future__ import annotations

from typing import Any


def partial_reason(predicate: dict[str, Any]) -> str | None:
    """Why the record does not cover its whole spec member, or None when it does."""
    reasons = []
    cov = predicate.get("coverage")
    if isinstance(cov, dict) and cov.get("complete") is False:
        checked, total = cov.get("checked"), cov.get("total")
        text = f"{checked} of {total} workloads" if checked is not None and total is not None else "coverage incomplete"
        if cov.get("checks_selected"):
            text += f", checks {', '.join(map(str, cov['checks_selected']))} only"
        reasons.append(text)
    sel = predicate.get("selection")
    if isinstance(sel, dict) and sel.get("partial") is True:
        reasons.append("the run was narrowed (selection.partial)")
    return "; ".join(reasons) or None


def checks_narrowed(predicate: dict[str, Any]) -> str | None:
    """Why the checks of the workloads that ran are fewer than the spec's, or None."""
    cov = predicate.get("coverage")
    if isinstance(cov, dict) and cov.get("checks_selected"):
        return f"checks {', '.join(map(str, cov['checks_selected']))} only"
    sel = predicate.get("selection")
    if isinstance(sel, dict):
        checks = sel.get("checks")
        left = sel.get("left_out") if isinstance(sel.get("left_out"), dict) else {}
        if checks or left.get("checks"):
            return "a check selection (selection.checks)"
    return None
