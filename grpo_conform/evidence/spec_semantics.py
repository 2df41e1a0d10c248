"""What a record says, checked against the spec the verifier resolves (issue 29), not only against itself.

`semantics.py` makes a record consistent with itself; a trusted key can still sign content the spec
contradicts. With the spec member the verifier's own checkout resolves (only when its identity is the
record's: another identity is the identities step's business), a record is refused when:
- it names a workload the member does not have, or its coverage does not add up to the member's
  workloads (extra coverage keys, such as `exercised`, are allowed);
- its spec.member is not the member its spec id names (a token-is record relabelled as another);
- a check is marked `pass` while its own evidence counts mismatches, NaN or Inf, or its message
  reports elements outside tolerance;
- a timing is below the DRAM floor its own record states, or below the strict floor recomputed
  from the resolved spec's workload (not the record's axes) on the catalogue GPU the record names,
  counting no masked row (a lower bound whatever the mask): physically impossible.
A GPU the catalogue does not know gets no recomputed floor (the record's own still applies), and the
report never ranks it. Since the adversarial round of 2026-12-05 also refused: a timing protocol
that is not one of the four, hardware names outside printable ASCII, and names that resolve to
different GPUs or a catalogue GPU under kind `cpu` (`gpu_named.py`): the floor used to come from one
name and the report's section from another, and `cpu` skipped the floor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from grpo_conform.evidence.gpu_named import resolve as resolve_gpu
from grpo_conform.evidence.gpu_named import text_problems
from grpo_conform.protocol_names import PROTOCOLS
from grpo_conform.spec.find import find_spec_in

_BAD_COUNTS = ("mismatches", "nan", "inf")
#: what the comparison writes when elements fail (compare.py); a `pass` saying it is a contradiction
_FAILURE_TEXT = re.compile(r"\b[1-9][0-9]*/[0-9]+ elements outside tolerance")


def _resolve(spec: dict[str, Any], root: Path | None) -> Any:
    if root is None:
        return None
    try:
        resolved = find_spec_in(str(spec["id"]), root / "specs")
    except Exception:  # noqa: BLE001 - a spec this checkout lacks cannot be judged here
        return None
    return resolved if resolved.identity == spec.get("identity") else None


def _counts(evidence: Any, depth: int = 0) -> list[str]:
    """'gradient.mismatches=3'-style findings of failure inside a check's evidence."""
    if depth > 6 or not isinstance(evidence, dict):
        return []
    out = []
    for k, v in evidence.items():
        if k in _BAD_COUNTS and isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out.append(f"{k}={v}")
        elif isinstance(v, dict):
            out += [f"{k}.{x}" for x in _counts(v, depth + 1)]
    return out


def member_problem(spec: dict[str, Any]) -> str | None:
    member, spec_id = spec.get("member"), str(spec.get("id", ""))
    if member is not None and "/" in spec_id and spec_id.rsplit("/", 1)[1] != member:
        return f"spec.member {member!r} is not the member its id {spec_id!r} names (a relabelled record)"
    return None


def spec_problems(statement: dict[str, Any], root: Path | None) -> list[str]:
    predicate = statement["predicate"]
    problems = [p for p in (member_problem(predicate["spec"]),) if p]
    for w in predicate["workloads"]:
        for c in w.get("checks", []):
            found = _counts(c.get("evidence"))
            if c.get("status") == "pass" and found:
                problems.append(f"{w['workload']}/{c['check']} is marked pass but its evidence finds {', '.join(found)}")
            elif c.get("status") == "pass" and _FAILURE_TEXT.search(str(c.get("message", ""))):
                problems.append(f"{w['workload']}/{c['check']} is marked pass but its message reports elements "
                                "outside tolerance")
        for t in w.get("timings", []):
            if t.get("protocol") not in PROTOCOLS:  # a table of its own name would be ranked with no floor
                problems.append(f"{w['workload']}: timing protocol {str(t.get('protocol'))[:40]!r} is none of "
                                f"{', '.join(PROTOCOLS)}")
            median = (t.get("event") or {}).get("median_ns")
            floor = (t.get("floor") or {}).get("floor_ns")
            if isinstance(median, (int, float)) and isinstance(floor, (int, float)) and median < floor:
                problems.append(f"{w['workload']} {t.get('protocol')}: median {median} ns is below the DRAM floor "
                                f"{floor} ns its record states: impossible")
    hw = predicate.get("hardware") or {}
    timed = any(w.get("timings") for w in predicate["workloads"])
    named = resolve_gpu(hw) if timed else None  # the catalogue imports torch: only for a timed record
    problems += named.problems if named is not None else text_problems(hw)  # resolve's include the text ones
    spec = _resolve(predicate["spec"], root)
    if spec is None:
        return problems
    names = [w.name for w in spec.workloads]
    unknown = sorted({w["workload"] for w in predicate["workloads"]} - set(names))
    if unknown:
        problems.append(f"workload(s) {unknown} are not workloads of {spec.id} (it has {len(names)})")
    problems += _spec_floor_problems(spec, predicate, named.gpu if named is not None else None)
    cov = predicate.get("coverage")
    if isinstance(cov, dict) and "workloads_run" in cov:
        listed = set(cov.get("workloads_run", [])) | {n.get("workload") for n in cov.get("workloads_not_run", [])}
        if listed != set(names) or cov.get("total") != len(names):
            problems.append(f"coverage lists {len(listed)} workload(s), total {cov.get('total')}; {spec.id} has "
                            f"{len(names)}: coverage must account for every workload of the member")
    return problems


_FLOORS: dict[tuple[str, str, str, str], Any] = {}  # a floor depends only on spec identity, workload, protocol, GPU


def _spec_floor_problems(spec: Any, predicate: dict[str, Any], gpu: Any) -> list[str]:
    if gpu is None:
        return []  # nothing timed, or no catalogue GPU: the record's own floor still applies (spec_problems)
    # here, not above: floors pulls torch, which `verify` of an untimed record never needs
    from grpo_conform.floors import below_floor, compute_floor, resolve_for_floor

    by_name = {w.name: w for w in spec.workloads}
    problems = []
    for w in predicate["workloads"]:
        if w["workload"] not in by_name:
            continue
        for t in w.get("timings", []):
            protocol, median = t.get("protocol"), (t.get("event") or {}).get("median_ns")
            if protocol not in PROTOCOLS or protocol == "backward" or not isinstance(median, (int, float)):
                continue
            key = (spec.identity, w["workload"], protocol, gpu.id)
            if key not in _FLOORS:
                try:
                    resolved = resolve_for_floor(spec, by_name[w["workload"]])
                    _FLOORS[key] = compute_floor(spec, resolved, protocol, gpu, unmasked=0.0)
                except Exception:  # noqa: BLE001 - a floor that cannot be computed judges nothing
                    _FLOORS[key] = None
            floor = _FLOORS[key]
            if floor is not None and below_floor(median, floor):
                problems.append(f"{w['workload']} {protocol}: median {median} ns is below the strict floor "
                                f"{floor.strict_ns} ns of {spec.id} on {gpu.name}: impossible")
    return problems
