"""Reading spec documents: JSON, then the JSON Schema, then the cross-references (`cross_checks`
for format 2), then the pydantic model; and where spec files are looked up (`spec_dirs`)."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import ValidationError

from grpo_conform.canonical import identity
from grpo_conform.spec.cross_checks import check_member
from grpo_conform.spec.model import ENV_SPEC_DIRS, FAMILY_FORMAT, SPEC_SCHEMA_FILE, Spec, SpecError
from grpo_conform.spec.operation_inputs import requirements_for


def _schema() -> dict[str, Any]:
    text = resources.files("grpo_conform.schemas").joinpath(SPEC_SCHEMA_FILE).read_text()
    return json.loads(text)


def _json_path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


_PASSED: set[str] = set()  # sha256 of the documents (sorted-key JSON) that passed: the verdict is a function of it


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


def validate_document(doc: Any, file: str | Path) -> None:
    """Schema first (the error names the JSON path and what was expected), then cross-references.
    A family document is checked against the schema only here; its members are checked resolved.
    A document that passed once passes again without the work: verifying the 172 committed records
    resolves the spec family of each record's commit again (6.0 s without it, 5.1 s with it, a second
    verification in one process)."""
    try:
        key = hashlib.sha256(json.dumps(doc, sort_keys=True, allow_nan=False).encode()).hexdigest()
    except (TypeError, ValueError):
        key = None
    if key is not None and key in _PASSED:
        return
    errors = sorted(_validator().iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = errors[0]
        raise SpecError(file, _json_path(err.absolute_path), _describe(err))
    if doc.get("format") != FAMILY_FORMAT:
        _cross_check(doc, file)
    if key is not None:
        _PASSED.add(key)


def _describe(err: jsonschema.ValidationError) -> str:
    if err.validator == "additionalProperties":
        return f"{err.message}; allowed keys are in the spec schema"
    if err.validator == "required":
        return f"missing required field: {err.message}"
    if err.validator in ("enum", "const"):
        return f"got {json.dumps(err.instance)}, expected {json.dumps(err.validator_value)}"
    if err.validator == "type":
        return f"got {json.dumps(err.instance)}, expected a value of type {err.validator_value}"
    return err.message


def _cross_check(doc: dict[str, Any], file: str | Path) -> None:
    def fail(path: str, problem: str) -> None:
        raise SpecError(file, path, problem)

    def unique(items: list[dict], where: str) -> set[str]:
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item["name"] in seen:
                fail(f"{where}[{i}].name", f"duplicate name {item['name']!r}")
            seen.add(item["name"])
        return seen

    axes = unique(doc["axes"], "$.axes")
    inputs = unique(doc["inputs"], "$.inputs")
    outputs = unique(doc["outputs"], "$.outputs")
    params = unique(doc["parameters"], "$.parameters")
    unique(doc["workloads"], "$.workloads")
    profiles = unique(doc["validation"]["profiles"], "$.validation.profiles")
    derived = set()
    for i, axis in enumerate(doc["axes"]):
        if "equals" in axis:
            base = axis["equals"].split()[0]
            if base not in axes or base == axis["name"]:
                fail(f"$.axes[{i}].equals", f"{axis['equals']!r} must refer to another declared axis ({sorted(axes)})")
            derived.add(axis["name"])
    for where, tensors in (("inputs", doc["inputs"]), ("outputs", doc["outputs"])):
        for i, t in enumerate(tensors):
            for j, a in enumerate(t["shape"]):
                if a not in axes:
                    fail(f"$.{where}[{i}].shape[{j}]", f"unknown axis {a!r}; declared axes: {sorted(axes)}")
            rng = t.get("range")
            if rng and rng["max_exclusive"] not in axes:
                fail(f"$.{where}[{i}].range.max_exclusive", f"unknown axis {rng['max_exclusive']!r}")
    diff = [t for t in doc["inputs"] if t["differentiable"]]
    _check_operation_inputs(doc, diff, fail)
    for i, g in enumerate(doc["gradients"]):
        if g["input"] not in inputs:
            fail(f"$.gradients[{i}].input", f"unknown input {g['input']!r}")
        if g["output"] not in outputs:
            fail(f"$.gradients[{i}].output", f"unknown output {g['output']!r}")
        ez = g.get("exact_zero")
        shape = next(t["shape"] for t in doc["inputs"] if t["name"] == g["input"])
        if ez and ez["axis"] not in shape:
            fail(f"$.gradients[{i}].exact_zero.axis", f"{ez['axis']!r} is not an axis of {g['input']}")
    tol_dtypes = {t["dtype"] for t in doc["tolerances"]}
    for i, w in enumerate(doc["workloads"]):
        base = f"$.workloads[{i}]"
        for a in sorted(axes - derived):
            if a not in w["axes"]:
                fail(f"{base}.axes", f"missing axis {a!r} (every non-derived axis needs a value)")
        for a, v in w["axes"].items():
            if a in derived:
                fail(f"{base}.axes.{a}", f"{a!r} is derived ({a} = ...); do not give it a value")
            if a not in axes:
                fail(f"{base}.axes.{a}", f"unknown axis {a!r}")
            minimum = next(x.get("min", 1) for x in doc["axes"] if x["name"] == a)
            low = v if isinstance(v, int) else v["min"]
            if low < minimum:
                fail(f"{base}.axes.{a}", f"{a} must be at least {minimum}")
            if isinstance(v, dict) and v["max"] < v["min"]:
                fail(f"{base}.axes.{a}", "max must not be below min")
        for t in doc["inputs"]:
            if t["dtypes"] == ["int64"] or len(t["dtypes"]) == 1 and t["name"] not in w["dtypes"]:
                continue
            dt = w["dtypes"].get(t["name"])
            if dt is None:
                fail(f"{base}.dtypes", f"missing dtype for input {t['name']!r} (one of {t['dtypes']})")
            if dt not in t["dtypes"]:
                fail(f"{base}.dtypes.{t['name']}", f"got {dt!r}, expected one of {t['dtypes']}")
        for name in w["dtypes"]:
            if name not in inputs:
                fail(f"{base}.dtypes.{name}", f"unknown input {name!r}")
        for d in diff:
            dt = w["dtypes"].get(d["name"], d["dtypes"][0])
            if dt not in tol_dtypes:
                fail(f"{base}.dtypes.{d['name']}", f"no tolerance declared for dtype {dt!r}")
    for key in ("base_profiles", "adversarial_profiles"):
        for j, name in enumerate(doc["validation"][key]):
            if name not in profiles:
                fail(f"$.validation.{key}[{j}]", f"unknown profile {name!r}; declared: {sorted(profiles)}")
    if doc["format"] == "grpo-conform-spec/2":
        check_member(doc, fail)
    elif params - {"epsilon_low", "epsilon_high", "temperature"}:
        fail("$.parameters", "the grpo family takes epsilon_low, epsilon_high and temperature only")


def _check_operation_inputs(doc: dict[str, Any], diff: list[dict[str, Any]], fail) -> None:
    """The inputs the spec's operation requires (`operation_inputs`): grpo-logits keeps the format-1
    rule (exactly one differentiable input); others name theirs, each with a gradient."""
    need = requirements_for(doc.get("operation"))
    if need.exactly_one_differentiable:
        if len(diff) != 1:
            fail("$.inputs", f"exactly one input must be differentiable, found {len(diff)}")
        return
    op = doc.get("operation")
    names = {t["name"]: t for t in doc["inputs"]}
    for name in need.differentiable + need.required:
        if name not in names:
            fail("$.inputs", f"operation {op!r} needs the input {name!r}; inputs: {sorted(names)}")
    allowed = set(need.differentiable) | set(need.optional_differentiable)
    for i, t in enumerate(doc["inputs"]):
        if t["differentiable"] != (t["name"] in allowed):
            what = "is differentiable" if t["name"] in allowed else "is not differentiable"
            fail(f"$.inputs[{i}].differentiable", f"for operation {op!r}, {t['name']!r} {what} "
                 f"(differentiable: {sorted(allowed)})")
    graded = {g["input"] for g in doc["gradients"]}
    for t in diff:
        if t["name"] not in graded:
            fail("$.gradients", f"the differentiable input {t['name']!r} has no gradient listed")


def load_spec(path: str | Path) -> Spec:
    """Read, validate and load a spec file; every problem is a `SpecError` naming file and path."""
    path = Path(path)
    doc = read_document(path)
    if isinstance(doc, dict) and doc.get("format") == FAMILY_FORMAT:
        names = [m.get("name") for m in doc.get("members", []) if isinstance(m, dict)]
        raise SpecError(path, "$.members", f"this file is a spec family; name a member (--member NAME; members: {', '.join(map(str, names))})")
    return spec_from_document(doc, path)


def read_document(path: str | Path) -> Any:
    """The parsed JSON of a spec file; unreadable or invalid JSON is a `SpecError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(path, "$", "file not found") from None
    except OSError as exc:
        raise SpecError(path, "$", f"cannot read: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(path, f"line {exc.lineno} column {exc.colno}", f"not valid JSON: {exc.msg}") from None


def spec_from_document(doc: Any, source: str | Path) -> Spec:
    """Validate a standalone or resolved-member document and load it; identity = sha256 of its RFC 8785 form."""
    validate_document(doc, source)
    body = {("schema_uri" if k == "$schema" else k): v for k, v in doc.items()}
    try:
        spec = Spec.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(source, _json_path(first["loc"]), first["msg"]) from None
    spec._identity = identity(doc)
    spec._source = str(source)
    return spec


#: The specs shipped in the wheel: setup.py copies the checkout's specs/*.json here at build time,
#: byte for byte (tests/test_packaging.py), so a spec's identity is the same installed or not.
PACKAGED_SPECS = Path(__file__).resolve().parent.parent / "specs"


def spec_dirs() -> list[Path]:
    """Where `spec = "<id>"` in a manifest is looked up, first match of the highest version winning:
    $GRPO_CONFORM_SPECS (os.pathsep-separated folders), ./specs, the checkout's specs/ (an editable
    install or PYTHONPATH), the specs packaged in the wheel."""
    dirs = [Path(p) for p in os.environ.get(ENV_SPEC_DIRS, "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "specs")
    checkout = Path(__file__).resolve().parent.parent.parent
    if (checkout / "pyproject.toml").is_file():  # not site-packages/specs, which another package may own
        dirs.append(checkout / "specs")
    dirs.append(PACKAGED_SPECS)
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique

