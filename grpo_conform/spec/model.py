"""The spec's data model: frozen pydantic models of a loaded spec (documents.py reads and checks
the JSON into them). The spec is the single source of shapes, dtypes, parameters, tolerances and
workloads: the validator reads them from here and repeats none of them in code. Identity = sha256
of the spec's RFC 8785 canonical JSON, so whitespace and key order never change it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, PrivateAttr

from grpo_conform.errors import GrpoConformError

SPEC_SCHEMA_FILE = "spec.schema.json"
FAMILY_FORMAT = "grpo-conform-spec-family/1"
MEMBER_FORMAT = "grpo-conform-spec/2"
ENV_SPEC_DIRS = "GRPO_CONFORM_SPECS"
#: What a spec without an `operation` field describes: GRPO over materialised logits (every spec
#: written before the field existed; the field is optional so that their identities stay as they are).
DEFAULT_OPERATION = "grpo-logits"


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
    """What values are valid (decision draws, docs/decisions.md): a numeric interval or a list of choices."""

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
    probes: Literal["full", "core", "smoke"] = "full"  # v2: the probe profile (docs/architecture.md section 5)
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
    policy: Literal["clip", "cispo", "sapo", "vespo"] = "clip"  # v2
    # v2: the sampling-ratio weight; vllm-truncate is TRL's token_truncate, the others its other modes (issue 33)
    correction: Literal["none", "vllm-truncate", "vllm-token-mask", "vllm-sequence-truncate",
                        "vllm-sequence-mask"] = "none"
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
    operation: Optional[str] = None  # read it through `operation_of` (absent: DEFAULT_OPERATION)
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


def operation_of(spec: Spec) -> str:
    """The operation a spec describes, by its name in grpo_conform.ops: the spec's `operation` field,
    or DEFAULT_OPERATION where the spec has none (the only way callers should read the field)."""
    return spec.operation or DEFAULT_OPERATION


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

