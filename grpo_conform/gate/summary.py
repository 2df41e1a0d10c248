"""`--summary FILE`: the run as Markdown, e.g. `--summary "$GITHUB_STEP_SUMMARY"` (appended, as
GitHub expects for that file; other files are written anew)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_conform.gate.progress import summary_line
from grpo_conform.gate.selection import report_partial

ICON = {"conformant": "✅", "failed": "❌", "load-error": "💥", "skipped": "⏭️"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def build_summary(report: Any) -> str:
    verdict = {0: "PASSED", 1: "FAILED", 2: "ERROR (usage, manifest or load error)",
               3: "NOTHING RAN (environment)"}.get(report.exit_code, str(report.exit_code))
    dev = report.device
    partial = report_partial(report)
    lines = [f"## grpo-conform: {verdict}{' (partial)' if partial else ''}", "",
             f"Device: {dev.get('name') or dev.get('kind', '?')}"
             + (" (Triton under TRITON_INTERPRET=1)" if report.interpreter else "")
             + (" · --strict" if report.strict else ""), ""]
    if partial:
        lines += [f"**{partial}**", ""]
    for note in report.notes:
        lines.append(f"- {note}")
    if report.notes:
        lines.append("")
    lines += ["| implementation | member | verdict | workloads run | checks passed | failed | message |",
              "|---|---|---|---|---|---|---|"]
    failures, not_run = [], []
    for impl in report.implementations:
        for m in impl.members or ():
            outcomes = [o for w in m.workloads for o in w.outcomes]
            passed = sum(1 for o in outcomes if o.status == "pass")
            bad = [(w, o) for w in m.workloads for o in w.outcomes if o.failed]
            failures += [(impl, m, w, o) for w, o in bad]
            not_run += [(impl, m, n) for n in m.coverage.not_run if n.kind not in ("deselected", "elsewhere")]
            lines.append(f"| `{impl.name}` | {m.member} | {ICON.get(m.status, '')} {m.status} | "
                         f"{m.coverage.checked} of {m.coverage.total} | {passed} | {len(bad)} | "
                         f"{_cell(m.message)[:300]} |")
        if not impl.members:
            lines.append(f"| `{impl.name}` | | {ICON.get(impl.status, '')} {impl.status} | | | | "
                         f"{_cell(impl.message)[:300]} |")
    if failures:
        lines += ["", "### Failures", ""]
        for impl, m, w, o in failures:
            lines.append(f"- **{impl.name}** {m.member} `{w.workload}` **{o.check}** ({o.status}): {_cell(o.message)}")
            evidence = json.dumps(o.evidence, indent=1, sort_keys=True, default=str)
            lines += ["  <details><summary>evidence</summary>", "", "  ```json",
                      *("  " + x for x in evidence[:8000].splitlines()), "  ```", "  </details>"]
    if not_run:
        lines += ["", f"<details><summary>{len(not_run)} workloads not run</summary>", ""]
        lines += [f"- {impl.name} {m.member} `{n.workload}`: {_cell(n.reason)}" for impl, m, n in not_run]
        lines += ["", "</details>"]
    if report.strict and report.strict_failures:
        lines += ["", f"--strict fails the run: {len(report.strict_failures)} skipped or not run."]
    lines += ["", f"`{summary_line(report)}`", ""]
    return "\n".join(lines)


def write_summary(report: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    append = str(path) == os.environ.get("GITHUB_STEP_SUMMARY")
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(build_summary(report))
    return path
