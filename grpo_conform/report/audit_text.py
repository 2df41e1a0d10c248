"""`grpo-conform audit FILE...` as compact text: a legend saying what each verdict word means, then
one line per record (file:line, verdict, what it is, why), memory and other non-timing rows on
lines of their own, and one summary line for all files. `--verbose` adds every finding.

The words are the leaderboard's (report/reported.py): `impossible` (below the floor of what it
claims), `not comparable` (possible, but not a time of the spec's operation, protocol and
workload), `plausible`, `unknown GPU`. A record can be impossible and not comparable at once: its
line then says both, each with its reason.
"""

from __future__ import annotations

from typing import Any

from grpo_conform.report.reported import MEANINGS, label

SHORT = {"operation": "another operation", "protocol": "another protocol", "workload": "other shapes",
         "gpu": "GPU not in the catalogue", "source-row": "another row of the source (its sequence-level, GSPO, row)"}


def _why_not_comparable(a: Any) -> str:
    parts = []
    for f in a.findings:
        if f.status != "mismatch":
            continue
        r = a.record
        detail = {"operation": r.operation, "protocol": f"{r.protocol}-only" if r.protocol == "backward" else r.protocol,
                  "workload": ", ".join(f"{k}={v}" for k, v in r.axes.items())}.get(f.check, "")
        parts.append(f"{SHORT.get(f.check, f.check)} ({detail})" if detail else SHORT.get(f.check, f.check))
    return ", ".join(parts)


def record_line(file: str, a: Any) -> str:
    r = a.record
    word = label(a)
    shape = ",".join(f"{k[0]}={v}" for k, v in r.axes.items())
    what = f"{r.implementation} {r.protocol} [{shape}{', ' + r.dtype if r.dtype else ''}] on {r.gpu}: {r.median_ms:g} ms"
    ratio = f"{a.floor_ratio:.2f}x the floor" if a.floor_ratio is not None and a.floor_ratio != float("inf") else ""
    if ratio and getattr(a, "spec_id", None) and a.floor is not None:  # a fused-linear row: name its floor
        ratio = f"{a.floor_ratio:.2f}x the {'backward-only' if a.floor.protocol == 'backward' else a.floor.protocol} " \
                f"floor ({a.floor.method}, {a.floor.binding} binds: {a.floor.floor_ns / 1e6:.3g} ms)"
    reasons = []
    if word == "impossible":
        proto = getattr(a.floor, "protocol", "") if a.floor is not None else ""
        model = getattr(a.floor, "method", "") or getattr(a.floor, "model", "") if a.floor is not None else ""
        where = a.gpu.gpu.name if a.gpu is not None else r.gpu
        reasons.append(f"impossible: {ratio or 'below the floor'} ({proto} floor, {model}, on {where})")
        if not a.comparable:
            reasons.append(f"and not comparable: {_why_not_comparable(a)}")
    elif word == "not comparable":
        reasons.append(f"not comparable: {_why_not_comparable(a)}" + (f"; {ratio}, physically possible" if ratio
                                                                       else ""))
    elif word == "plausible":
        reasons.append(f"plausible: {ratio}, same operation, protocol and workload" if ratio else "plausible")
    else:
        reasons.append("unknown GPU: no floor to judge it against")
    if getattr(a, "summary", ""):  # a fused-linear row: what it timed comes first (audit_fused.py)
        reasons.insert(0, a.summary + ";")
    return f"{file}:{r.where.replace('line ', '')}  {word.upper():<14}  {what}  -- {' '.join(reasons)}"


def detail_lines(a: Any) -> list[str]:
    """Under a fused-linear row: which row of Liger's CSV it is and the reproduction block."""
    out = []
    source = a.finding("source-row")
    if source is not None:
        out.append(f"      source row: {source.status}: {source.message}")
    if getattr(a, "reproduction", None) is not None:
        out += [f"      {line}" for line in a.reproduction.lines()]
    return out


def legend() -> list[str]:
    return ["verdicts: " + "; ".join(f"{k.upper()} = {v}" for k, v in MEANINGS.items())]


def compact_lines(reports: list[Any], verbose: bool = False) -> list[str]:
    out = legend()
    totals = {k: 0 for k in MEANINGS}
    other = 0
    for rep in reports:
        fused = rep.fused_text() if hasattr(rep, "fused_text") else ""
        out.append(f"{rep.file} ({rep.format}, {len(rep.audits)} timing record(s), {len(rep.ignored)} other row(s)) "
                   f"against {rep.spec.id} {rep.spec.version}{fused}")
        for a in rep.audits:
            totals[label(a)] += 1
            out.append(record_line(rep.file, a))
            if not verbose:
                out += detail_lines(a)
            else:
                out += [f"      {f.check}: {f.status}: {f.message}" for f in a.findings]
        for i in rep.ignored:  # memory rows and other metrics: said once, never silently dropped
            other += 1
            out.append(f"{rep.file}:{i.where.replace('line ', '')}  {'NOT AUDITED':<14}  {i.reason}")
    n = sum(totals.values())
    out.append(f"{n} record(s) in {len(reports)} file(s): " + ", ".join(f"{v} {k}" for k, v in totals.items())
               + (f"; {other} non-timing row(s) (e.g. memory) not audited" if other else ""))
    return out
