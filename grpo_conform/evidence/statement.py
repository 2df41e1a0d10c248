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

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

import grpo_conform
from grpo_conform.canonical import canonical_bytes
from grpo_conform.errors import GrpoConformError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://grpo-conform.dev/attestation/check-result/v1"
SCHEMA_FILE = "evidence-statement.v1.schema.json"
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


def outcome_lists(impl: Any) -> tuple[list[str], list[str], list[str]]:
    passed, warned, failed = [], [], []
    for w in impl.workloads:
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


def build_statement(report: Any, impl: Any) -> dict[str, Any]:
    """The in-toto Statement v1 for `impl` (an ImplementationResult) of `report` (a CheckReport)."""
    spec = _spec_for(report, impl)
    impl_path = project_relative(impl.path) or Path(impl.path).name
    spec_uri = project_relative(spec.source) if spec.source else None
    manifest = impl.manifest
    passed, warned, failed = outcome_lists(impl)
    spec_descriptor: dict[str, Any] = {"name": f"spec:{spec.id}@{spec.version}", "digest": {"sha256": spec.identity}}
    if spec_uri:
        spec_descriptor["uri"] = spec_uri
    hardware: dict[str, Any] = {"device": report.device}
    for key, value in report.hardware.items():
        hardware["reported_device" if key == "device" else key] = value  # report.device keeps the name
    predicate = {
        "result": overall_result(impl.status, warned, failed),
        "configuration": [
            spec_descriptor,
            {"name": f"implementation:{impl.name}", "uri": impl_path, "digest": {"sha256": impl.identity}},
        ],
        "passedTests": passed,
        "warnedTests": warned,
        "failedTests": failed,
        "verdict": impl.status,
        "message": impl.message,
        "spec": {"id": spec.id, "version": spec.version, "identity": spec.identity},
        "implementation": {
            "name": impl.name,
            "language": manifest.get("language"),
            "license": manifest.get("license"),
            "source": manifest.get("source"),
            "identity": impl.identity,
            "path": impl_path,
            "description": manifest.get("description"),
        },
        "workloads": [w.to_json() for w in impl.workloads],
        "hardware": hardware,
        "software": dict(report.software),
        "run": {"started": report.started, "finished": report.finished, "triton_interpreter": report.interpreter},
    }
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": impl_path, "digest": {"sha256": impl.identity}}],
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


@lru_cache(maxsize=1)
def statement_schema() -> dict[str, Any]:
    return json.loads(resources.files("grpo_conform.schemas").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def schema_problems(statement: Any) -> list[str]:
    """Every way `statement` breaks the published schema, as '<JSON path>: <problem>' (empty when valid)."""
    validator = jsonschema.Draft202012Validator(statement_schema())
    errors = sorted(validator.iter_errors(statement), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_json_path(e.absolute_path)}: {e.message}" for e in errors]


def check_statement(statement: Any) -> None:
    problems = schema_problems(statement)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise StatementError(f"the statement breaks {SCHEMA_FILE}: {problems[0]}{more}")


def _json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out
