"""The in-toto Statement v1 of one implementation's check result, and its RFC 8785 bytes.

The predicate keeps the field names of in-toto's test-result predicate (`result`,
`configuration`, `passedTests`, `warnedTests`, `failedTests`) so policies written against it
work unchanged, and adds what a GRPO conformance run needs: the spec, the implementation, every
workload's checks with their evidence and timings, hardware, software, run times and verdict.

Mapping of check outcomes to the test-result lists (one entry per "<workload>/<check>"):
- passedTests: every outcome with status "pass" (informational ones included);
- failedTests: every outcome that fails the implementation (`CheckOutcome.failed`);
- warnedTests: skipped checks, and informational checks that did not pass (e.g. non-bitwise
  determinism): nothing failed, but a reader should look.
`result` is FAILED when the verdict is failed, load-error or skipped (a skipped implementation
proved nothing, so its record must never read as a success), else WARNED when warnedTests is
non-empty, else PASSED.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

import grpo_conform
from grpo_conform.canonical import canonical_bytes
from grpo_conform.errors import GrpoConformError
from grpo_conform.gate.selection import describe, selection_block

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_V1 = "https://grpo-conform.dev/attestation/check-result/v1"
PREDICATE_TYPE = "https://grpo-conform.dev/attestation/check-result/v2"
#: predicateType -> schema file: v1 records (the committed H200 evidence) stay verifiable.
SCHEMAS = {PREDICATE_V1: "evidence-statement.v1.schema.json", PREDICATE_TYPE: "evidence-statement.v2.schema.json"}
SCHEMA_FILE = SCHEMAS[PREDICATE_TYPE]
#: The checkout the package lives in; record paths are relative to it so they mean the same everywhere.
PROJECT_ROOT = Path(grpo_conform.__file__).resolve().parent.parent
_MAX_SAFE_INT = 2**53 - 1


class StatementError(GrpoConformError):
    """A report that cannot become a statement, or a statement that breaks the published schema."""


def project_relative(path: str | Path) -> str | None:
    """`path` relative to the project root (else to the current directory) in POSIX form, or None."""
    p = Path(path).resolve()
    for base in (PROJECT_ROOT, Path.cwd().resolve()):
        try:
            return p.relative_to(base).as_posix()
        except ValueError:
            continue
    return None


def json_ready(value: Any, where: str = "$") -> Any:
    """A copy of `value` that RFC 8785 accepts, or a StatementError naming the JSON path that cannot be.

    Follows the report's own convention (compare.json_float): NaN and infinities become the
    strings "nan", "inf", "-inf"; integers beyond 2^53-1 (which JSON numbers cannot carry exactly)
    become decimal strings; tuples become lists; numpy/torch scalars become Python numbers.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value if abs(value) <= _MAX_SAFE_INT else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise StatementError(f"{where}: key {k!r} is a {type(k).__name__}; JSON object keys are strings")
            out[k] = json_ready(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [json_ready(v, f"{where}[{i}]") for i, v in enumerate(value)]
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        plain = item()
        if isinstance(plain, (int, float, bool)):
            return json_ready(plain, where)
    raise StatementError(f"{where}: a {type(value).__name__} cannot go into a record; expected JSON values "
                         "(report this as a bug in the code that produced the report)")


def _spec_for(report: Any, impl: Any) -> Any:
    specs = list(report.specs.values())
    if len(specs) == 1:  # also the --spec FILE case, where every implementation used that spec
        return specs[0]
    ref = str(impl.manifest.get("spec", ""))
    sid, _, version = ref.partition("@")
    found = [s for s in specs if s.id == sid and (not version or s.version == version)]
    if not found:
        raise StatementError(f"implementation {impl.name}: its spec {ref!r} is not among the report's specs "
                             f"({', '.join(f'{s.id}@{s.version}' for s in specs) or 'none'})")
    return max(found, key=lambda s: tuple(int(x) for x in s.version.split(".")))


def outcome_lists(workloads: Any) -> tuple[list[str], list[str], list[str]]:
    passed, warned, failed = [], [], []
    workloads = getattr(workloads, "workloads", workloads)  # an ImplementationResult also works
    for w in workloads:
        for o in w.outcomes:
            name = f"{w.workload}/{o.check}"
            if o.failed:
                failed.append(name)
            elif o.status == "pass":
                passed.append(name)
            else:  # skipped, or informational and not passing
                warned.append(name)
    return passed, warned, failed


def overall_result(verdict: str, warned: list[str], failed: list[str]) -> str:
    if failed or verdict in ("failed", "load-error", "skipped"):
        return "FAILED"
    return "WARNED" if warned else "PASSED"


def builder_identity(environ: Any = None) -> dict[str, Any]:
    """Who ran it, in the SLSA sense: the CI job or machine identity the environment gives.

    Order: $GRPO_CONFORM_BUILDER_ID (set by whoever operates the runner), GitHub Actions (the run's
    URL), GitLab CI ($CI_JOB_URL), else the host name. Every source but a CI system's own variables is
    self-reported, and even those are only as trustworthy as the signer who vouches for the record.
    """
    env = os.environ if environ is None else environ
    if env.get("GRPO_CONFORM_BUILDER_ID", "").strip():
        return {"id": env["GRPO_CONFORM_BUILDER_ID"].strip(), "source": "GRPO_CONFORM_BUILDER_ID"}
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_RUN_ID"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        url = f"{server}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/{env['GITHUB_RUN_ID']}"
        if env.get("GITHUB_RUN_ATTEMPT"):
            url += f"/attempts/{env['GITHUB_RUN_ATTEMPT']}"
        out = {"id": url, "source": "github-actions"}
        if env.get("GITHUB_WORKFLOW_REF"):
            out["workflow"] = env["GITHUB_WORKFLOW_REF"]
        return out
    if env.get("GITLAB_CI") == "true" and env.get("CI_JOB_URL"):
        return {"id": env["CI_JOB_URL"], "source": "gitlab-ci"}
    return {"id": f"host:{socket.gethostname()}", "source": "hostname (self-reported)"}


def _file_sha256(path: str | None) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _coverage(spec: Any, device: str, workloads: Any, member: Any) -> dict[str, Any]:
    """Which workloads ran and which did not (with why): the member's Coverage when it has one, else
    derived from the spec's workloads (filtered by --workload, or not for this device)."""
    ran = [w.workload for w in workloads]
    declared = getattr(member, "coverage", None)
    not_run: list[dict[str, str]] = []
    checks: list[str] = []
    given = declared.get("not_run") if isinstance(declared, dict) else getattr(declared, "not_run", None)
    if given is not None:
        for item in given:
            name = item.get("workload") if isinstance(item, dict) else getattr(item, "workload", item)
            reason = item.get("reason", "") if isinstance(item, dict) else getattr(item, "reason", "")
            kind = item.get("kind") if isinstance(item, dict) else getattr(item, "kind", None)
            entry = {"workload": str(name), "reason": str(reason) or "not run"}
            if kind:
                entry["kind"] = str(kind)
            not_run.append(entry)
        raw_checks = declared.get("checks", ()) if isinstance(declared, dict) else getattr(declared, "checks", ())
        checks = [str(c) for c in raw_checks or ()]
    else:
        for w in getattr(spec, "workloads", ()):
            if w.name not in ran:
                devices = getattr(w, "devices", ())
                reason = "not selected (--workload)" if device in devices else f"not run on {device or 'this device'}"
                not_run.append({"workload": w.name, "reason": reason})
    k, n = len(ran), len(ran) + len(not_run)
    return {"workloads_run": ran, "workloads_not_run": not_run, "checked": k, "total": n,
            "complete": k == n and not checks, "checks_selected": checks}


def _exercised(spec: Any, workloads: Any) -> dict[str, Any]:
    """coverage.exercised (what the parent drew, per category) and coverage.declared (the cases the
    spec declares): issue 27 item 6; `verify --require-exercised` / `--require-declared-cases` read them."""
    # Imported here, not at the top: the operations package imports torch, which `verify` (this module's
    # other user) never needs; a `verify` subprocess started in ~3 s of CPU more for it (docs/timing.md).
    from grpo_conform.ops.grpo_logits.declared_cases import declared_names, merge_exercised, workload_exercised

    parts = [workload_exercised(getattr(w, "draws", None) or {}, getattr(w, "dtypes", None) or {},
                                getattr(w, "axes", None) or {}) for w in workloads]
    out: dict[str, Any] = {"exercised": merge_exercised(*parts)}
    if getattr(spec, "parameters", None) is not None:
        out["declared"] = declared_names(spec)
    return out


def _family(spec: Any) -> str | None:
    family = getattr(spec, "family", None)
    if family is None or isinstance(family, str):
        return family
    return f"{getattr(family, 'id', '?')}@{getattr(family, 'version', '?')}"


def build_statement(report: Any, impl: Any, member: Any = None) -> dict[str, Any]:
    """The in-toto Statement (predicate v2) for `impl` (an ImplementationResult) of `report`.

    `member` (a MemberResult: `.spec`, `.status`, `.message`, `.workloads`, optional `.coverage`)
    makes the record of one spec member; without it the implementation's own result is used.
    """
    if member is None and len(getattr(impl, "members", ()) or ()) == 1:
        member = impl.members[0]
    elif member is None and getattr(impl, "members", ()):
        raise StatementError(f"implementation {impl.name} has {len(impl.members)} members: one record per member "
                             "(pass member=, or use write_evidence)")
    spec = member.spec if member is not None else _spec_for(report, impl)
    status = member.status if member is not None else impl.status
    message = member.message if member is not None else impl.message
    workloads = tuple(member.workloads if member is not None else impl.workloads)
    impl_path = project_relative(impl.path) or Path(impl.path).name
    spec_uri = project_relative(spec.source) if spec.source else None
    manifest = impl.manifest
    passed, warned, failed = outcome_lists(workloads)
    file_sha = _file_sha256(spec.source)
    spec_digest = {"rfc8785Sha256": spec.identity, **({"sha256": file_sha} if file_sha else {})}
    spec_descriptor: dict[str, Any] = {"name": f"spec:{spec.id}@{spec.version}", "digest": spec_digest}
    if spec_uri:
        spec_descriptor["uri"] = spec_uri
    hardware: dict[str, Any] = {"device": report.device, "self_reported": True}
    for key, value in report.hardware.items():
        hardware["reported_device" if key == "device" else key] = value  # report.device keeps the name
    device_kind = str(report.device.get("kind", ""))
    coverage = _coverage(spec, device_kind, workloads, member)
    coverage.update(_exercised(spec, workloads))
    # The implementation's other members: which this run also checked (their own records) and which not.
    ran_members = [m.spec.member for m in getattr(impl, "members", ()) or () if getattr(m.spec, "member", None)]
    declared = [str(m) for m in manifest.get("members") or ()]
    if declared or ran_members:
        coverage["members_run"] = ran_members
        coverage["members_not_run"] = [{"member": m, "reason": "not run by this check (no selected workload, "
                                        "device or --member)"} for m in declared if m not in ran_members]
    spec_block = {"id": spec.id, "version": spec.version, "identity": spec.identity, "file_sha256": file_sha}
    if getattr(spec, "member", None):
        spec_block["member"] = spec.member
    if _family(spec):
        spec_block["family"] = _family(spec)
    selection = selection_block(report, impl, member)  # issue 28: a narrowed run says so
    summary = status
    if status == "conformant" and selection["partial"]:
        summary = f"partial, conformant on what was selected: {describe(selection)}"[:200]
    elif status == "conformant" and not coverage["complete"]:
        what = "checked workloads" if not coverage["checks_selected"] else "checked workloads and selected checks"
        summary = f"conformant on the {what} ({coverage['checked']} of {coverage['total']})"
    predicate = {
        "result": overall_result(status, warned, failed),
        "configuration": [
            spec_descriptor,
            {"name": f"implementation:{impl.name}", "uri": impl_path, "digest": {"dirHash": impl.identity}},
        ],
        "passedTests": passed,
        "warnedTests": warned,
        "failedTests": failed,
        "verdict": status,
        "summary": summary,
        "message": message,
        "spec": spec_block,
        "coverage": coverage,
        "selection": selection,
        "implementation": {
            "name": impl.name,
            "language": manifest.get("language"),
            "license": manifest.get("license"),
            "source": manifest.get("source"),
            "identity": impl.identity,
            "path": impl_path,
            "description": manifest.get("description"),
        },
        "workloads": [w.to_json() for w in workloads],
        "hardware": hardware,
        "software": dict(report.software),
        "run": {"started": report.started, "finished": report.finished, "triton_interpreter": report.interpreter,
                "builder": builder_identity()},
    }
    # How the worker was isolated (--sandbox), beside the worker's user and privileges in the report;
    # absent when no worker ran (a skipped implementation).
    sandbox = (getattr(impl, "worker", None) or {}).get("sandbox")
    if isinstance(sandbox, dict) and sandbox.get("kind") in ("none", "bwrap"):
        predicate["run"]["sandbox"] = sandbox["kind"]
    # Whether the worker started with compiled kernels its implementation's earlier run left
    # (isolation/compile_cache.py): "reused", "fresh" (an empty store) or "off"; absent when no worker ran.
    cache = (getattr(impl, "worker", None) or {}).get("compile_cache")
    if isinstance(cache, dict):
        predicate["run"]["compile_cache"] = ("off" if "off" in cache else
                                             "reused" if cache.get("reused_files") else "fresh")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": impl_path, "digest": {"dirHash": impl.identity}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }
    return json_ready(statement)


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """The RFC 8785 bytes that become the DSSE payload (and whose sha256 is the record identity)."""
    try:
        return canonical_bytes(statement)
    except Exception as exc:  # rfc8785 raises several types; all mean "not canonical JSON"
        raise StatementError(f"the statement is not RFC 8785 serializable: {exc}") from None


@lru_cache(maxsize=4)
def statement_schema(file: str = SCHEMA_FILE) -> dict[str, Any]:
    return json.loads(resources.files("grpo_conform.schemas").joinpath(file).read_text(encoding="utf-8"))


def schema_file_for(statement: Any) -> str:
    kind = statement.get("predicateType") if isinstance(statement, dict) else None
    return SCHEMAS.get(kind, SCHEMA_FILE) if isinstance(kind, str) else SCHEMA_FILE


@lru_cache(maxsize=4)
def _validator(file: str) -> jsonschema.Draft202012Validator:
    """One per schema: its resolver keeps the $refs it has looked up (10.5 -> 8.8 ms a record, 373 records)."""
    return jsonschema.Draft202012Validator(statement_schema(file))


def schema_problems(statement: Any) -> list[str]:
    """Every way `statement` breaks its published schema (v1 or v2 by predicateType), as '<JSON path>: <problem>'."""
    validator = _validator(schema_file_for(statement))
    errors = sorted(validator.iter_errors(statement), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_json_path(e.absolute_path)}: {e.message}" for e in errors]


def check_statement(statement: Any) -> None:
    problems = schema_problems(statement)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise StatementError(f"the statement breaks {schema_file_for(statement)}: {problems[0]}{more}")


def _json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out
