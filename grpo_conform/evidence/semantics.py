"""What a statement means must follow from what it records: the checks shared by `sign` and `verify`.

The schema says a record is well formed; these say it is honest with itself:
- the payload bytes are exactly their RFC 8785 form (one serialization, one record identity);
- exactly one subject, named by the implementation's path and carrying its identity (under
  `sha256` in v1 records, `dirHash` in v2), the same as the configuration descriptors;
- passedTests / warnedTests / failedTests, `result` and `verdict` recomputed from the per-check
  statuses of the workloads (a record cannot say "conformant" over failing checks);
- names and paths are plain (no control, bidi or zero-width characters; relative paths, no `..`);
- v2: the coverage block agrees with the workloads that ran (k of n) and the spec descriptor
  carries the spec file's plain sha256 beside the canonical identity.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Any

import rfc8785

from grpo_conform.canonical import is_canonical_fast
from grpo_conform.evidence.identities import safe_relative

PREDICATE_V1 = "https://grpo-conform.dev/attestation/check-result/v1"
PREDICATE_V2 = "https://grpo-conform.dev/attestation/check-result/v2"
FAILING = {"fail", "error", "timeout"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def subject_digest_key(statement: dict[str, Any]) -> str:
    return "dirHash" if statement.get("predicateType") == PREDICATE_V2 else "sha256"


def recompute_lists(workloads: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    passed, warned, failed = [], [], []
    for w in workloads:
        for c in w["checks"]:
            name = f"{w['workload']}/{c['check']}"
            if c["status"] in FAILING and not c.get("informational", False):
                failed.append(name)
            elif c["status"] == "pass":
                passed.append(name)
            else:
                warned.append(name)
    return passed, warned, failed


def expected_result(verdict: str, warned: list[str], failed: list[str]) -> str:
    if failed or verdict in ("failed", "load-error", "skipped"):
        return "FAILED"
    return "WARNED" if warned else "PASSED"


def unsafe_text(value: str) -> str | None:
    """Why `value` cannot be shown as a name (control, format, bidi, zero-width characters), or None."""
    for ch in value:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"):
            return f"contains the character U+{ord(ch):04X} ({cat})"
    return None


def canonical_problem(payload: bytes, statement: Any) -> str | None:
    if is_canonical_fast(payload):  # certain; else the full RFC 8785 serialization decides
        return None
    try:
        canonical = rfc8785.dumps(statement)
    except Exception as exc:  # rfc8785 raises several types (integer range, floats, ...)
        return f"the payload cannot be RFC 8785 serialized: {exc}"
    if canonical != payload:
        return (f"the payload bytes are not their RFC 8785 form ({len(payload)} bytes, canonical form "
                f"{len(canonical)} bytes): re-serialize the statement before signing")
    return None


def semantic_problems(statement: dict[str, Any]) -> list[str]:
    """Every way a schema-valid statement contradicts itself; empty when it is consistent."""
    problems: list[str] = []
    predicate = statement["predicate"]
    impl, spec = predicate["implementation"], predicate["spec"]
    key = subject_digest_key(statement)
    subjects = statement["subject"]
    if len(subjects) != 1:
        problems.append(f"expected exactly one subject (the implementation folder), found {len(subjects)}")
    for i, s in enumerate(subjects):
        digest = s["digest"].get(key)
        if s["name"] != impl["path"]:
            problems.append(f"subject[{i}].name {s['name']!r} is not the implementation path {impl['path']!r}")
        if digest != impl["identity"]:
            problems.append(f"subject[{i}].digest.{key} {str(digest)[:16]}… is not the implementation identity "
                            f"{impl['identity'][:16]}…")
        extra = sorted(set(s["digest"]) - {key})
        if extra:
            problems.append(f"subject[{i}].digest carries {extra} beside {key}: one folder, one digest")
    for field, value in (("implementation.path", impl["path"]),):
        bad = safe_relative(value)
        if bad:
            problems.append(f"predicate.{field} {value!r}: {bad}")
    for field, value in (("implementation.name", impl["name"]), ("spec.id", spec["id"])):
        why = unsafe_text(value)
        if why:
            problems.append(f"predicate.{field}: {why}")
    descriptors: dict[str, list[dict[str, Any]]] = {}
    for d in predicate["configuration"]:
        descriptors.setdefault(d["name"].split(":", 1)[0], []).append(d)
        if "uri" in d and safe_relative(d["uri"]):
            problems.append(f"configuration {d['name']!r}: uri {d['uri']!r}: {safe_relative(d['uri'])}")
    for kind in ("spec", "implementation"):
        if len(descriptors.get(kind, [])) != 1:
            problems.append(f"configuration: expected exactly one '{kind}:' descriptor, found "
                            f"{len(descriptors.get(kind, []))}")
    if len(descriptors.get("implementation", [])) == 1:
        d = descriptors["implementation"][0]
        if d["digest"].get(key) != impl["identity"]:
            problems.append(f"configuration {d['name']}: digest.{key} is not the implementation identity")
        if d.get("uri", impl["path"]) != impl["path"]:
            problems.append(f"configuration {d['name']}: uri {d.get('uri')!r} is not the implementation path")
    if len(descriptors.get("spec", [])) == 1:
        d = descriptors["spec"][0]
        canon_key = "sha256" if key == "sha256" else "rfc8785Sha256"
        if d["digest"].get(canon_key) != spec["identity"]:
            problems.append(f"configuration {d['name']}: digest.{canon_key} is not predicate.spec.identity")
        if key == "dirHash" and d["digest"].get("sha256") != spec.get("file_sha256"):
            problems.append(f"configuration {d['name']}: digest.sha256 is not predicate.spec.file_sha256")
    workloads = predicate["workloads"]
    for w in workloads:
        for name in (w["workload"], *(c["check"] for c in w["checks"])):
            if not _NAME.match(name):
                problems.append(f"workload/check name {name!r}: expected [A-Za-z0-9._+-] characters")
    passed, warned, failed = recompute_lists(workloads)
    for label, recorded, recomputed in (("passedTests", predicate["passedTests"], passed),
                                        ("warnedTests", predicate["warnedTests"], warned),
                                        ("failedTests", predicate["failedTests"], failed)):
        if sorted(recorded) != sorted(recomputed):
            problems.append(f"{label} lists {len(recorded)} test(s) but the checks give {len(recomputed)}"
                            + _diff(recorded, recomputed))
    verdict = predicate["verdict"]
    if verdict == "conformant" and (failed or not passed):
        problems.append(f"verdict 'conformant' but {len(failed)} check(s) failed" if failed
                        else "verdict 'conformant' but no check passed")
    if verdict == "failed" and not failed:
        problems.append("verdict 'failed' but no check failed")
    result = expected_result(verdict, warned, failed)
    if predicate["result"] != result:
        problems.append(f"result {predicate['result']} but the checks and verdict give {result}")
    run = predicate["run"]
    if run["started"] > run["finished"]:
        problems.append(f"run.started {run['started']} is after run.finished {run['finished']}")
    if key == "dirHash":
        problems += _coverage_problems(predicate)
    return problems


def _diff(recorded: list[str], recomputed: list[str]) -> str:
    extra = sorted(set(recorded) - set(recomputed))[:3]
    missing = sorted(set(recomputed) - set(recorded))[:3]
    parts = ([f"not backed by the checks: {extra}"] if extra else []) + ([f"missing: {missing}"] if missing else [])
    return f" ({'; '.join(parts)})" if parts else ""


def _coverage_problems(predicate: dict[str, Any]) -> list[str]:
    cov = predicate["coverage"]
    ran = [w["workload"] for w in predicate["workloads"]]
    problems = []
    if sorted(cov["workloads_run"]) != sorted(ran):
        problems.append(f"coverage.workloads_run {cov['workloads_run']} is not the workloads recorded {ran}")
    not_run = [w["workload"] for w in cov["workloads_not_run"]]
    if set(not_run) & set(ran):
        problems.append(f"coverage: {sorted(set(not_run) & set(ran))} both ran and did not run")
    k, n = len(ran), len(ran) + len(not_run)
    if cov["checked"] != k or cov["total"] != n:
        problems.append(f"coverage says {cov['checked']} of {cov['total']}, the workloads give {k} of {n}")
    complete = k == n and not cov.get("checks_selected")
    if cov["complete"] != complete:
        problems.append(f"coverage.complete is {cov['complete']} for {k} of {n} workloads"
                        + (" and a check selection" if cov.get("checks_selected") else ""))
    return problems


#: A record dated after the verification time by more than this is refused: its date would keep it
#: "newest" (on the leaderboard, in a merge) forever. The allowance is for clocks that disagree a little.
CLOCK_SKEW = timedelta(minutes=10)


def future_problem(statement: dict[str, Any], now: datetime) -> str | None:
    """Why the record's run.finished cannot be believed at `now`, or None."""
    finished = str(((statement.get("predicate") or {}).get("run") or {}).get("finished", ""))
    try:
        when = datetime.fromisoformat(finished.replace("Z", "+00:00"))
    except ValueError:
        return f"run.finished {finished!r} is not an RFC 3339 time"
    if when.tzinfo is None:
        return f"run.finished {finished!r} has no time zone"
    if when > now + CLOCK_SKEW:
        return (f"run.finished {finished} is after the verification time {now.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
                ": a record from the future would stay the newest forever")
    return None


def coverage_phrase(predicate: dict[str, Any]) -> str:
    cov = predicate.get("coverage")
    if not cov:
        return f"{len(predicate['workloads'])} workload(s)"
    text = (f"all {cov['total']} workloads" if cov["complete"]
            else f"on the checked workloads ({cov['checked']} of {cov['total']})")
    if cov.get("checks_selected"):
        text += f", checks {', '.join(cov['checks_selected'])}"
    others = [m["member"] for m in cov.get("members_not_run", ())]
    if others:
        text += f"; {len(others)} member(s) not run: {', '.join(others[:3])}{'…' if len(others) > 3 else ''}"
    return text
