"""Progress lines for logs (stderr when it is not a terminal) and the closing summary with counts.

A line: `[  12.3s] pytorch grpo/token-is odd-vocab: conformance [3, 6, 5003]`: the elapsed time
since the run started, the implementation, the spec member, the workload, the step (or its result,
with the failed checks). The callback takes plain strings, so any caller (the CLI's spinner, a
test, a slot process relaying to its parent) can use it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable

from grpo_conform.gate.selection import report_partial
from grpo_conform.results import STRICT_KINDS

Progress = Callable[[str], None]


class Reporter:
    def __init__(self, progress: Progress | None = None, started: float | None = None):
        self.progress = progress or (lambda _line: None)
        self.started = time.monotonic() if started is None else started

    def __call__(self, implementation: str, member: str | None, workload: str | None, step: str) -> None:
        where = " ".join(x for x in (implementation, member, workload) if x)
        self.line(f"{where}: {step}")

    def line(self, text: str) -> None:
        self.progress(f"[{time.monotonic() - self.started:7.1f}s] {text}")


def counts(report: Any) -> dict[str, Counter]:
    impls = Counter(i.status for i in report.implementations)
    workloads: Counter = Counter()
    checks: Counter = Counter()
    for impl in report.implementations:
        members = impl.members or ()
        for m in members:
            workloads["run"] += len(m.workloads)
            workloads["not run"] += sum(1 for n in m.coverage.not_run if n.kind in STRICT_KINDS)
        if not members:
            workloads["run"] += len(impl.workloads)
        for w in impl.workloads:
            for o in w.outcomes:
                checks["failed" if o.failed else ("skipped" if o.status == "skipped" else "passed")] += 1
    return {"implementations": impls, "workloads": workloads, "checks": checks}


def summary_line(report: Any, elapsed: float | None = None) -> str:
    """One line for the end of a CI log: what passed, failed, was skipped, and the exit code."""
    c = counts(report)
    impl = c["implementations"]
    parts = [f"{sum(impl.values())} implementation{'s' if sum(impl.values()) != 1 else ''}: "
             + ", ".join(f"{impl[k]} {k}" for k in ("conformant", "failed", "load-error", "skipped") if impl[k])
             if impl else "no implementation checked"]
    w = c["workloads"]
    parts.append(f"{w['run']} workloads run" + (f", {w['not run']} not run" if w["not run"] else ""))
    ch = c["checks"]
    parts.append(f"{sum(ch.values())} checks: {ch['passed']} passed, {ch['failed']} failed, {ch['skipped']} skipped")
    if report.strict and report.strict_failures:
        parts.append(f"--strict: {len(report.strict_failures)} skipped")
    partial = report_partial(report)  # a narrowed run never reads as a full verdict (issue 28)
    if partial:
        parts.append(partial)
    tail = f" in {elapsed:.1f} s" if elapsed is not None else ""
    return "grpo-conform: " + "; ".join(parts) + f"{tail}; exit code {report.exit_code}"
