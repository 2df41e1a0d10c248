"""Semantics specs: JSON validated by a JSON Schema, loaded into frozen pydantic models.

The spec is the single source of shapes, dtypes, parameters, tolerances and workloads: the
validator reads them from here and repeats none of them in code. Identity = sha256 of the
spec's RFC 8785 canonical JSON, so whitespace and key order never change it.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

import jsonschema
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from grpo_conform.canonical import identity
from grpo_conform.errors import GrpoConformError

SPEC_SCHEMA_FILE = "spec.schema.json"
FAMILY_FORMAT = "grpo-conform-spec-family/1"
MEMBER_FORMAT = "grpo-conform-spec/2"
ENV_SPEC_DIRS = "GRPO_CONFORM_SPECS"


class SpecError(GrpoConformError):
    """A spec file that cannot be read, breaks the schema, or contradicts itself."""

    def __init__(self, file: str | Path, path: str, problem: str):
        self.file, self.path, self.problem = str(file), path, problem
        super().__init__(f"{file}: at {path}: {problem}")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Axis(_Frozen):
    name: str
    description: str = ""
    min: int = 1
    equals: Optional[str] = None

    def derivation(self) -> tuple[str, int] | None:
        """`seq + 1` -> ("seq", 1)."""
        if self.equals is None:
            return None
        base, sign, amount = self.equals.split()
        return base, int(amount) * (1 if sign == "+" else -1)


class ValueRange(_Frozen):
    min: int
    max_exclusive: str


class TensorSpec(_Frozen):
    name: str
    description: str = ""
    dtypes: tuple[str, ...]
    shape: tuple[str, ...]
    range: Optional[ValueRange] = None
    differentiable: bool
    optional: bool = False  # v2: an input only some members declare (old_logprobs, completion_mask, ...)


class OutputSpec(_Frozen):
    name: str
    description: str = ""
    dtypes: tuple[str, ...]
    shape: tuple[str, ...]
    accept_shapes: tuple[tuple[int, ...], ...] = ()


class ExactZero(_Frozen):
    axis: str
    index: int


class GradientSpec(_Frozen):
    output: str
    input: str
    dtype: Literal["same_as_input"]
    shape: Literal["same_as_input"]
    exact_zero: Optional[ExactZero] = None
    exact_zero_masked: bool = False  # v2: rows of masked positions get exactly 0
    description: str = ""


class Domain(_Frozen):
    """What values are valid (decision 7): a numeric interval or a list of choices."""

    min: Optional[float] = None
    min_exclusive: bool = False
    max: Optional[float] = None
    max_exclusive: bool = False
    choices: Optional[tuple[Union[bool, int, float, str], ...]] = None

    def contains(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        if isinstance(value, (bool, str)):
            return False
        if self.min is not None and (value < self.min or (self.min_exclusive and value == self.min)):
            return False
        if self.max is not None and (value > self.max or (self.max_exclusive and value == self.max)):
            return False
        return True


class Avoid(_Frozen):
    value: float
    width: float


class Draw(_Frozen):
    """Uniform draw in [min, max] from the parent's seed, rejecting values within `width` of an avoided one."""

    min: float
    max: float
    avoid: tuple[Avoid, ...] = ()


class Parameter(_Frozen):
    name: str
    type: Literal["float", "int", "bool", "str"]
    value: Union[bool, float, int, str]
    description: str = ""
    domain: Optional[Domain] = None
    draw: Optional[Draw] = None


class CaseTie(_Frozen):
    parameter: str
    bound: Literal["value", "1+value", "1-value"]  # where the clip bound sits, as a function of the value


class Case(_Frozen):
    """A declared case (grpo_conform.declared_cases): parameter values, an equality or an exact tie."""

    name: str
    description: str = ""
    values: Optional[dict[str, Union[bool, float, int, str]]] = None
    equal: Optional[tuple[str, ...]] = None
    tie: Optional[CaseTie] = None


class LossTolerance(_Frozen):
    atol: float
    rtol: float

    def allowed(self, expected: float) -> float:
        return self.atol + self.rtol * abs(expected)


class GradientTolerance(_Frozen):
    element_rtol: float
    element_atol_row_scale: float
    element_atol: float
    frobenius_rtol: float
    row_sum_fraction: float
    # v2: per-element absolute rounding a row sum may carry, times the vocabulary (fp16 underflow:
    # elements below half a subnormal step round to 0, so tiny rows cannot sum to 0 in fp16)
    row_sum_atol: float = 0.0


class Tolerance(_Frozen):
    dtype: str
    loss: LossTolerance
    gradient: GradientTolerance
    rationale: str


class SpanRange(_Frozen):
    min: int
    max: int


class Workload(_Frozen):
    name: str
    description: str = ""
    axes: dict[str, Union[int, SpanRange]]
    dtypes: dict[str, str]
    devices: tuple[Literal["cpu", "cuda"], ...]
    seeds: int = 2
    timed: bool = False
    probes: Literal["full", "core", "smoke"] = "full"  # v2: the probe profile (docs/architecture.md s. 5)
    # "extended" workloads run only when asked for (`check --extended` or `--workload NAME`): the
    # default CPU run stays within a minute per implementation; records say what was not run.
    tier: Literal["standard", "extended"] = "standard"

    @property
    def drawn(self) -> bool:
        return any(isinstance(v, SpanRange) for v in self.axes.values())


class Profile(_Frozen):
    name: str
    description: str = ""
    kind: Literal["normal", "peaked", "student_t"]
    scale: float
    clamp: Optional[float] = None
    spike: float = 0.0
    df: float = 2.0


class MemberInputs(_Frozen):
    """v2: how grpo_conform.member_inputs draws the optional inputs (ratios, masks, ...)."""

    boundary_margin: float = 0.02  # drawn ratios stay this far (relative) from every clip boundary
    ratio_min: float = 0.4
    ratio_max_factor: float = 1.5  # the top interval ends at this times the largest boundary
    sequence_noise: float = 0.3  # per-token log-ratio spread around a sequence's ratio (GSPO)
    # ref_logprobs = logp + sign(A_b) * U[ref_gap_min, ref_gap_max]: the KL term then adds to the
    # policy term (no cancellation) and 1 - exp(ref - logp) stays well away from 0, so an fp32
    # log-sum-exp error in logp (~1e-3 at logits near 1e4) stays a small relative error
    ref_gap_min: float = 0.6
    ref_gap_max: float = 1.2
    sampling_ratio_min: float = 0.3
    sampling_ratio_max_factor: float = 1.6  # sampling ratios go up to this times the cap
    unmasked_fraction: float = 0.75  # expected fraction of unmasked tokens in timed workloads


class AdvantageDistribution(_Frozen):
    mean: float
    std: float
    min_abs: float


class Poison(_Frozen):
    last_position: tuple[Literal["nan", "huge", "inf"], ...]


class Validation(_Frozen):
    profiles: tuple[Profile, ...]
    base_profiles: tuple[str, ...]
    adversarial_profiles: tuple[str, ...]
    advantages: AdvantageDistribution
    poison: Poison
    member_inputs: MemberInputs = MemberInputs()

    def profile(self, name: str) -> Profile:
        return next(p for p in self.profiles if p.name == name)


class Semantics(_Frozen):
    family: str
    importance_sampling: str
    reduction: str
    old_logprobs: str = ""
    formula: tuple[str, ...] = ()
    policy: Literal["clip", "cispo"] = "clip"  # v2
    correction: Literal["none", "vllm-truncate"] = "none"  # v2: per-token sampling-ratio weight
    ties: str = ""  # v2: which branch carries the gradient at an exact tie


class KlTerm(_Frozen):
    present: bool
    beta: float
    description: str = ""


class MaskTerm(_Frozen):
    present: bool
    description: str = ""


class Terms(_Frozen):
    kl: KlTerm
    mask: MaskTerm


class TrafficItem(_Frozen):
    tensor: str  # an input name, or "grad:<input>"
    rows: Literal["all", "scored", "unmasked"] = "all"


class TrafficProtocol(_Frozen):
    read: tuple[TrafficItem, ...] = ()
    write: tuple[TrafficItem, ...] = ()


class Timing(_Frozen):
    upstream_scale: float = 0.25


class FamilyRef(_Frozen):
    id: str
    version: str
    member: str


class Constraints(_Frozen):
    no_mutation: bool
    no_aliasing: bool
    no_output_reuse: bool
    determinism: Literal["unspecified", "bitwise"]
    last_position: Literal["ignored"]
    nonfinite_logits: Literal["unspecified"]
    notes: str = ""


@dataclass(frozen=True)
class ResolvedWorkload:
    """A workload with every axis a number (ranges drawn), ready to generate inputs for."""

    workload: Workload
    axes: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    @property
    def name(self) -> str:
        return self.workload.name

    def numel(self, tensor: str) -> int:
        n = 1
        for d in self.shapes[tensor]:
            n *= d
        return n


class Spec(_Frozen):
    """A loaded spec. `identity` is the sha256 of the canonical JSON of the file's content."""

    schema_uri: Optional[str] = None
    format: str
    id: str
    version: str
    title: str
    summary: str = ""
    semantics: Semantics
    axes: tuple[Axis, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    gradients: tuple[GradientSpec, ...]
    parameters: tuple[Parameter, ...]
    terms: Terms
    constraints: Constraints
    tolerances: tuple[Tolerance, ...]
    workloads: tuple[Workload, ...]
    validation: Validation
    # v2 (resolved family members); absent in the frozen v1 file
    family: Optional[FamilyRef] = None
    traffic: Optional[dict[str, TrafficProtocol]] = None
    layouts: dict[str, tuple[Literal["contiguous", "offset", "strided"], ...]] = {}
    timing: Timing = Timing()
    cases: tuple[Case, ...] = ()
    operation: Optional[str] = None  # absent: grpo-logits (grpo_conform/ops/__init__.py; not in any identity)

    _identity: str = PrivateAttr(default="")
    _source: str = PrivateAttr(default="")

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def source(self) -> str:
        return self._source

    @property
    def member(self) -> str | None:
        return self.family.member if self.family is not None else None

    @property
    def reference_name(self) -> str:
        """How a manifest or record names this spec: `grpo/token-is@1.0.0` or `grpo-token-is@1.0.0`."""
        return f"{self.id}@{self.version}"

    def has_input(self, name: str) -> bool:
        return any(t.name == name for t in self.inputs)

    @property
    def parameter_values(self) -> dict[str, Any]:
        return {p.name: p.value for p in self.parameters}

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def tolerance(self, dtype: str) -> Tolerance:
        for tol in self.tolerances:
            if tol.dtype == dtype:
                return tol
        raise SpecError(self._source, "$.tolerances", f"no tolerance for dtype {dtype!r}")

    def workload(self, name: str) -> Workload:
        for w in self.workloads:
            if w.name == name:
                return w
        known = ", ".join(w.name for w in self.workloads)
        raise SpecError(self._source, "$.workloads", f"no workload named {name!r} (known: {known})")

    def workloads_for(self, device: str, extended: bool = False) -> tuple[Workload, ...]:
        return tuple(w for w in self.workloads if device in w.devices and (extended or w.tier == "standard"))

    @cached_property
    def differentiable_input(self) -> TensorSpec:
        return next(t for t in self.inputs if t.differentiable)

    def resolve(self, workload: Workload, rng: random.Random | None = None) -> ResolvedWorkload:
        """Give every axis a value: fixed ones as written, ranges drawn from `rng`, derived computed."""
        rng = rng or random.Random()
        values: dict[str, int] = {}
        for axis in self.axes:
            if axis.derivation() is not None:
                continue
            raw = workload.axes[axis.name]
            values[axis.name] = raw if isinstance(raw, int) else rng.randint(raw.min, raw.max)
        for axis in self.axes:
            derived = axis.derivation()
            if derived is not None:
                values[axis.name] = values[derived[0]] + derived[1]
        shapes = {t.name: tuple(values[a] for a in t.shape) for t in self.inputs}
        return ResolvedWorkload(workload, values, shapes, dict(workload.dtypes))

    def summary_lines(self) -> list[str]:
        """A readable summary for `spec show`."""
        lines = [f"{self.title}", f"  {self.summary}" if self.summary else ""]
        if self.family is not None:
            sem = self.semantics
            lines.append(f"family: {self.family.id} {self.family.version}, member {self.family.member}")
            lines.append(f"semantics: loss type {sem.reduction}, {sem.importance_sampling}-level ratio, policy {sem.policy}, "
                         f"correction {sem.correction}")
            lines.extend(f"formula: {f}" for f in sem.formula)
            if sem.ties:
                lines.append(f"ties: {sem.ties}")
        axes = ", ".join(a.name + (f" = {a.equals}" if a.equals else "") for a in self.axes)
        lines.append(f"axes: {axes}")
        for t in self.inputs:
            extra = f", values in [{t.range.min}, {t.range.max_exclusive})" if t.range else ""
            grad = ", differentiable" if t.differentiable else ""
            lines.append(f"input  {t.name}: {'|'.join(t.dtypes)} [{', '.join(t.shape)}]{extra}{grad}")
        for o in self.outputs:
            lines.append(f"output {o.name}: {'|'.join(o.dtypes)} [{', '.join(o.shape)}]")
        for g in self.gradients:
            zero = f"; exactly 0 at {g.exact_zero.axis}[{g.exact_zero.index}]" if g.exact_zero else ""
            lines.append(f"gradient d{g.output}/d{g.input}: same shape and dtype as {g.input}{zero}")
        lines.append("parameters: " + ", ".join(f"{p.name}={p.value}" for p in self.parameters))
        for p in self.parameters:
            if p.domain is not None or p.draw is not None:
                lines.append(f"parameter {p.name}: default {p.value!r}; domain {_domain_text(p.domain)}; "
                             f"{_draw_text(p.draw)}")
        kl = "KL term" if self.terms.kl.present else "no KL term"
        mask = "mask" if self.terms.mask.present else "no mask"
        lines.append(f"terms: {kl}, {mask}")
        c = self.constraints
        lines.append(
            f"constraints: no mutation={c.no_mutation}, no aliasing={c.no_aliasing}, "
            f"no output reuse={c.no_output_reuse}, determinism {c.determinism}, "
            f"last position {c.last_position}"
        )
        for tol in self.tolerances:
            g = tol.gradient
            lines.append(
                f"tolerance {tol.dtype}: loss atol {tol.loss.atol:g} rtol {tol.loss.rtol:g}; gradient element "
                f"rtol {g.element_rtol:g} + {g.element_atol_row_scale:g}*s + {g.element_atol:g}, "
                f"frobenius {g.frobenius_rtol:g}, row sums {g.row_sum_fraction:g}"
                + (f" + {g.row_sum_atol:g}*vocab" if g.row_sum_atol else "")
            )
        for name, protocol in (self.traffic or {}).items():
            reads = ", ".join(f"{i.tensor}[{i.rows}]" for i in protocol.read) or "nothing"
            writes = ", ".join(f"{i.tensor}[{i.rows}]" for i in protocol.write) or "nothing"
            lines.append(f"traffic {name}: reads {reads}; writes {writes}")
        for name, kinds in self.layouts.items():
            lines.append(f"layouts {name}: {', '.join(kinds)}")
        for w in self.workloads:
            axes = ", ".join(f"{k}={v if isinstance(v, int) else f'{v.min}..{v.max}'}" for k, v in w.axes.items())
            dts = ", ".join(f"{k}={v}" for k, v in w.dtypes.items())
            timed = (", timed" if w.timed else "") + (f", {w.probes} probes" if w.probes != "full" else "")
            lines.append(f"workload {w.name}: {axes}; {dts}; on {'/'.join(w.devices)}{timed}")
        return [line for line in lines if line]


def _domain_text(d: Domain | None) -> str:
    if d is None:
        return "unstated"
    if d.choices is not None:
        return "one of " + ", ".join(map(str, d.choices))
    lo = "" if d.min is None else f"{'>' if d.min_exclusive else '>='} {d.min:g}"
    hi = "" if d.max is None else f"{'<' if d.max_exclusive else '<='} {d.max:g}"
    return " and ".join(x for x in (lo, hi) if x) or "any number"


def _draw_text(d: Draw | None) -> str:
    if d is None:
        return "not drawn (fixed)"
    avoid = "".join(f", away from {a.value:g} by {a.width:g}" for a in d.avoid)
    return f"drawn uniformly in [{d.min:g}, {d.max:g}]{avoid}"


def _schema() -> dict[str, Any]:
    text = resources.files("grpo_conform.schemas").joinpath(SPEC_SCHEMA_FILE).read_text()
    return json.loads(text)


def _json_path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def validate_document(doc: Any, file: str | Path) -> None:
    """Schema first (the error names the JSON path and what was expected), then cross-references.
    A family document is checked against the schema only here; its members are checked resolved."""
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = errors[0]
        raise SpecError(file, _json_path(err.absolute_path), _describe(err))
    if doc.get("format") != FAMILY_FORMAT:
        _cross_check(doc, file)


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
    if len(diff) != 1:
        fail("$.inputs", f"exactly one input must be differentiable, found {len(diff)}")
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
        dt = w["dtypes"].get(diff[0]["name"], diff[0]["dtypes"][0])
        if dt not in tol_dtypes:
            fail(f"{base}.dtypes.{diff[0]['name']}", f"no tolerance declared for dtype {dt!r}")
    for key in ("base_profiles", "adversarial_profiles"):
        for j, name in enumerate(doc["validation"][key]):
            if name not in profiles:
                fail(f"$.validation.{key}[{j}]", f"unknown profile {name!r}; declared: {sorted(profiles)}")
    if doc["format"] == "grpo-conform-spec/2":
        from grpo_conform.spec_checks import check_member

        check_member(doc, fail)
    elif params - {"epsilon_low", "epsilon_high", "temperature"}:
        fail("$.parameters", "the grpo family takes epsilon_low, epsilon_high and temperature only")


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
PACKAGED_SPECS = Path(__file__).resolve().parent / "specs"


def spec_dirs() -> list[Path]:
    """Where `spec = "<id>"` in a manifest is looked up, first match of the highest version winning:
    $GRPO_CONFORM_SPECS (os.pathsep-separated folders), ./specs, the checkout's specs/ (an editable
    install or PYTHONPATH), the specs packaged in the wheel."""
    dirs = [Path(p) for p in os.environ.get(ENV_SPEC_DIRS, "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "specs")
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():  # not site-packages/specs, which another package may own
        dirs.append(checkout / "specs")
    dirs.append(PACKAGED_SPECS)
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


_ID_VERSION = re.compile(r"^(?P<id>[a-z0-9][a-z0-9-]*)(/(?P<member>[a-z0-9][a-z0-9-]*))?(@(?P<version>[0-9]+(\.[0-9]+)*))?$")


def find_spec(reference: str, dirs: list[Path] | None = None) -> Spec:
    """Find a spec among the spec directories (highest version wins). `id` or `id@version` names a
    standalone file; `family/member` or `family/member@version` a family member; an unversioned
    `family-member` (e.g. `grpo-token-is`) the family member when the family has it (decision 1),
    else the standalone file of that id."""
    from grpo_conform import spec_family

    m = _ID_VERSION.match(reference)
    if not m:
        raise SpecError(reference, "$", "expected a spec id such as 'grpo-token-is', 'grpo-token-is@1.0.0' or 'grpo/token-is'")
    dirs = spec_dirs() if dirs is None else dirs
    where = ", ".join(str(d) for d in dirs) or "(no spec directory found)"
    if m["member"] is not None:
        fam = spec_family.find_family(m["id"], m["version"], dirs)
        if fam is None:
            raise SpecError(reference, "$", f"no spec family {m['id']!r}{' version ' + m['version'] if m['version'] else ''} in {where}")
        return fam.member(m["member"])
    if m["version"] is None:
        member = spec_family.alias_member(m["id"], dirs)
        if member is not None:
            return member
        fam = spec_family.find_family(m["id"], None, dirs)
        if fam is not None:
            raise SpecError(reference, "$", f"{m['id']!r} is a spec family: name a member ('{m['id']}/NAME'; "
                            f"members: {', '.join(fam.member_names)})")
    found: list[Spec] = []
    for d in dirs:
        for file in sorted(d.glob("*.json")):
            try:
                doc = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("id") == m["id"] and doc.get("format") != FAMILY_FORMAT:
                if m["version"] is None or doc.get("version") == m["version"]:
                    found.append(load_spec(file))
    if not found:
        raise SpecError(
            reference, "$", f"no spec with this id in {where}; pass --spec FILE or set {ENV_SPEC_DIRS}"
        )
    return max(found, key=lambda s: tuple(int(x) for x in s.version.split(".")))


def draw_parameters(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Parameter values for one conformance workload (grpo_conform.parameter_draws)."""
    from grpo_conform.parameter_draws import draw_parameters as draw

    return draw(spec, rng)


def specs_for_manifest(manifest: Any, spec_path: str | Path | None = None, dirs: list[Path] | None = None) -> tuple[Spec, ...]:
    """One resolved `Spec` per member a manifest declares (grpo_conform.spec_family.specs_for_manifest)."""
    from grpo_conform.spec_family import specs_for_manifest as resolve

    return resolve(manifest, spec_path, dirs)
