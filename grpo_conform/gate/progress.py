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

from grpo_conform.gate.selection import EXTENDED_REASON, report_partial
from grpo_conform.results import INTERNAL_ERROR, not_judged

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
    not_run: Counter = Counter()  # by label (NOT_RUN_LABEL): every workload not run, not only --strict's
    checks: Counter = Counter()
    for impl in report.implementations:
        members = impl.members or ()
        for m in members:
            workloads["run"] += len(m.workloads)
            not_run.update(not_run_label(n) for n in m.coverage.not_run)
        if not members:
            workloads["run"] += len(impl.workloads)
        for w in impl.workloads:
            for o in w.outcomes:  # "not judged" as the table says it (results.not_judged), apart from skipped
                checks["failed" if o.failed else ("not judged" if not_judged(o) else "internal error"
                                                  if INTERNAL_ERROR in o.evidence else
                                                  "skipped" if o.status == "skipped" else "passed")] += 1
    return {"implementations": impls, "workloads": workloads, "not_run": not_run, "checks": checks}


def not_run_label(n: Any) -> str:
    """Why a workload did not run, in the words the table's not-run lines use (render.not_run_lines)."""
    if n.kind == "deselected":
        return "extended" if n.reason == EXTENDED_REASON else "not selected"
    return NOT_RUN_LABEL.get(n.kind, n.kind)


NOT_RUN_LABEL = {"device": "for another device", "skipped": "skipped", "stopped": "stopped", "hung": "after a hang",
                 "elsewhere": "in another shard"}


def summary_line(report: Any, elapsed: float | None = None) -> str:
    """One line for the end of a CI log: what passed, failed, was skipped, and the exit code."""
    c = counts(report)
    impl = c["implementations"]
    parts = [f"{sum(impl.values())} implementation{'s' if sum(impl.values()) != 1 else ''}: "
             + ", ".join(f"{impl[k]} {k}" for k in ("conformant", "failed", "load-error", "skipped") if impl[k])
             if impl else "no implementation checked"]
    w, nr = c["workloads"], c["not_run"]
    parts.append(f"{w['run']} workloads run" + (f", {sum(nr.values())} not run ("
                                                 + ", ".join(f"{v} {k}" for v, k in sorted(
                                                     ((v, k) for k, v in nr.items()), reverse=True)) + ")"
                                                 if nr else ""))
    ch = c["checks"]
    parts.append(f"{sum(ch.values())} checks: {ch['passed']} passed, {ch['failed']} failed"
                 + "".join(f", {ch[k]} {k}" for k in ("not judged", "skipped") if ch[k])
                 + (f", {ch['internal error']} not judged after an internal error of grpo-conform "
                    f"({len(report.internal_errors)} workload(s): please report it)" if ch["internal error"] else ""))
    if report.strict and report.strict_failures:  # the same words as the CLI's --strict line
        parts.append(f"--strict: {len(report.strict_failures)} skipped or not run")
    partial = report_partial(report)  # a narrowed run never reads as a full verdict (issue 28)
    if partial:
        parts.append(partial)
    tail = f" in {elapsed:.1f} s" if elapsed is not None else ""
    return "grpo-conform: " + "; ".join(parts) + f"{tail}; exit code {report.exit_code}"
