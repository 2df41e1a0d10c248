"""What a failed run ends with: one summary line (failed checks, counts) and the first failure's
evidence in full, as plain lines, so an author sees the root cause without scrolling or --format json.

Works on `ImplementationResult`s, with or without per-member results (decision member-results in
docs/decisions.md): workloads are gathered from `impl.members[*].workloads` where present, else
`impl.workloads`.
"""

from __future__ import annotations

from typing import Any, Iterable

from grpo_conform.results import CheckOutcome, not_judged

MAX_LIST = 12  # longer lists of numbers (timing samples) are elided; every dict and string is shown whole


def workloads_of(impl: Any) -> list[tuple[str, Any]]:
    """(member label, WorkloadResult) pairs of an implementation result."""
    members = getattr(impl, "members", None) or ()
    if members:
        return [(getattr(m, "name", None) or getattr(getattr(m, "spec", None), "id", "") or "", w)
                for m in members for w in getattr(m, "workloads", ())]
    return [("", w) for w in getattr(impl, "workloads", ())]


def first_failure(impl: Any) -> tuple[str, Any, CheckOutcome] | None:
    """The first failing outcome in run order; `loss`/`gradient` come first within a workload
    (the root cause goes on top)."""
    for member, w in workloads_of(impl):
        failed = [o for o in w.outcomes if o.failed]
        failed.sort(key=lambda o: 0 if o.check in ("runs", "contract", "loss", "gradient") else 1)
        if failed:
            return member, w, failed[0]
    return None


def summary_line(impl: Any) -> str:
    """e.g. `bf16-arithmetic FAILED: gradient (1 of 1 workloads); 3 checks not judged; 14 passed`."""
    pairs = workloads_of(impl)
    n = len(pairs)
    by_check: dict[str, int] = {}
    passed = judged_out = 0
    for _m, w in pairs:
        for o in w.outcomes:
            if o.failed:
                by_check[o.check] = by_check.get(o.check, 0) + 1
            elif not_judged(o):
                judged_out += 1
            elif o.status == "pass":
                passed += 1
    status = str(getattr(impl, "status", "")).upper()
    if not by_check:
        return f"{impl.name} {status}: {passed} check results passed on {n} workload(s)"
    failed = ", ".join(f"{c} ({k} of {n} workloads)" for c, k in by_check.items())
    extra = f"; {judged_out} not judged (each depends on a check that already failed)" if judged_out else ""
    return f"{impl.name} {status}: {len(by_check)} check(s) failed: {failed}{extra}; {passed} passed"


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.9g}"
    return str(v)


def evidence_lines(value: Any, indent: str = "  ") -> list[str]:
    """An outcome's evidence as indented `key: value` lines, nothing cut except long number lists."""
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
                    shown = ", ".join(_scalar(x) for x in v[:MAX_LIST])
                    more = f", … ({len(v) - MAX_LIST} more in --format json)" if len(v) > MAX_LIST else ""
                    out.append(f"{indent}{k}: [{shown}{more}]")
                else:
                    out.append(f"{indent}{k}:")
                    out += evidence_lines(v, indent + "  ")
            elif isinstance(v, str) and "\n" in v:
                out.append(f"{indent}{k}: |")
                out += [f"{indent}  {line}" for line in v.rstrip("\n").split("\n")]
            else:
                out.append(f"{indent}{k}: {_scalar(v) if v != {} and v != [] else v}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict):
                flat = all(not isinstance(x, (dict, list)) or (isinstance(x, list) and len(x) <= 4)
                           for x in v.values())
                if flat:
                    out.append(f"{indent}- " + ", ".join(f"{k}={_scalar(x)}" for k, x in v.items()))
                else:
                    out.append(f"{indent}- [{i}]")
                    out += evidence_lines(v, indent + "  ")
            else:
                out.append(f"{indent}- {_scalar(v)}")
    else:
        out.append(f"{indent}{_scalar(value)}")
    return out


def failure_lines(impl: Any) -> list[str]:
    """Summary line, then the first failure: where, its message whole, its evidence."""
    lines = [summary_line(impl)]
    found = first_failure(impl)
    if found is None:
        return lines
    member, w, o = found
    where = f"{member} / " if member else ""
    lines.append(f"first failure: {where}{w.workload} / {o.check} ({o.status}): {o.message}")
    lines += evidence_lines(o.evidence)
    return lines


def failing(impls: Iterable[Any]) -> list[Any]:
    return [i for i in impls if getattr(i, "status", "") in ("failed", "load-error")]
