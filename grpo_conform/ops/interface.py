"""What an operation gives the validator (issue 30, item 4): one interface, implemented once per operation.

The engine (conformance calls, timed calls, floors, the gate's sizing) knows specs, workloads,
tensors by name and gradients by input name; everything that depends on what the operation computes
comes from here: seeded inputs, the float64 reference with one gradient per differentiable input,
how each gradient is grouped into units for worst-index reports, the work terms of the floors, and
the size and description of a workload. `grpo_conform.ops.OPERATIONS` maps a spec's operation name
to its object (grpo_conform/ops/__init__.py says how a spec without the field is read).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # annotations only
    import torch

    from grpo_conform.spec import ResolvedWorkload, Spec


def fresh_seed() -> int:
    """A seed no implementation can derive: drawn from the OS, never passed to a worker."""
    return secrets.randbits(62)


@dataclass(frozen=True)
class WorkloadSize:
    """The tensor whose size scales a workload's cost (worker timeouts, memory, peak ratios) and its
    element count."""

    tensor: str
    elements: int


@dataclass(frozen=True)
class GradientGrouping:
    """How one gradient is compared: viewed as [units, width], a unit (a row: the index reported as the
    worst one) spans `unit_axes`, its elements lie along `width_axes` (the axes after the unit axes)."""

    input: str  # the differentiable input; the gradient's name in `{name: grad}`
    unit_axes: tuple[str, ...]
    width_axes: tuple[str, ...]

    def units(self, resolved: "ResolvedWorkload") -> int:
        return math.prod(resolved.axes[a] for a in self.unit_axes)

    def width(self, resolved: "ResolvedWorkload") -> int:
        return math.prod(resolved.axes[a] for a in self.width_axes)


@dataclass(frozen=True)
class Gemm:
    """One matrix product a protocol cannot avoid: [m, k] x [k, n] in `dtype` (fp32 accumulation),
    `transposed` naming which operand a kernel reads transposed ("a", "b" or ""), `what` it computes,
    `operands` the inputs whose values a and b are ("" where no input holds them, e.g. d logits), `rows`
    the dimension ("m" or "k") that runs over the operation's rows, so that a kernel may form the product
    in chunks of rows ("" where none does). The GEMM ceiling (grpo_conform/gemm_ceiling.py) times exactly
    these with the device's library, whole and in chunks of rows, on the timed inputs' own values where
    `operands` names them (a GEMM's time depends on its operands' values and on its size)."""

    m: int
    k: int
    n: int
    dtype: str
    what: str
    transposed: str = ""
    operands: tuple[str, str] = ("", "")
    rows: str = ""

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    def to_json(self) -> dict[str, Any]:
        return {"m": self.m, "k": self.k, "n": self.n, "dtype": self.dtype, "what": self.what,
                "transposed": self.transposed, "operands": list(self.operands), "rows": self.rows}


@dataclass(frozen=True)
class Arithmetic:
    """Arithmetic a call cannot avoid, for the arithmetic floors: exponentials (special-function unit)
    and, for operations with matrix products, their FLOPs (tensor cores). A count of 0 comes with the
    reason there is none."""

    exponentials: int
    exp_text: str
    flops: int = 0  # GEMM FLOPs (a fused linear operation); none over given logits
    flop_text: str = ""


@runtime_checkable
class GradientChunk(Protocol):
    """Reference gradient of units [start, stop) of one gradient (float64 `values` [stop - start, width]);
    `scale` [stop - start] bounds every |element| of its unit (the tolerances scale with it)."""

    start: int
    stop: int
    values: "torch.Tensor"
    scale: "torch.Tensor"


class Operation(Protocol):
    """One operation a spec can name. Every method is pure given its arguments (seeded generation)."""

    name: str
    summary: str  # one line: what the operation computes
    # a timed slot's full draw serves all three protocols (its in-place refresh changes every value and
    # every row's statistics between passes); False: a fresh full draw per protocol
    refresh_spans_protocols: bool
    # a failing call's outputs are compared with the family's neighbouring semantics (checks/judging.py,
    # likely_cause); the variants are written over this operation's inputs
    diagnosed: bool
    # float16 gradients are judged at a loss scale (the upstream probe's large scalar up to 2^16): False where the
    # operation's gradients are formed in forward, before the upstream scalar is known (docs/checks.md,
    # "float16 and the other declared dtypes")
    loss_scaled: bool

    # -- workloads ---------------------------------------------------------------------------------
    def workload_size(self, spec: "Spec", resolved: "ResolvedWorkload") -> WorkloadSize: ...

    def device_bytes(self, spec: "Spec", resolved: "ResolvedWorkload") -> int:
        """At most what one workload's conformance run holds on the GPU, the validator's and the
        implementation's together: what it asks for where slots share a GPU (gate/gpu_share.py)."""
        ...

    def describe_workload(self, spec: "Spec", resolved: "ResolvedWorkload") -> str:
        """One line naming the workload's shape, as progress lines print it."""
        ...

    # -- inputs ------------------------------------------------------------------------------------
    def input_kind(self, name: str) -> str:
        """The kind of a declared input (what its generator draws: a mask, token ids, ...)."""
        ...

    def generate(self, spec: "Spec", resolved: "ResolvedWorkload", seed: int, device: Any, *,
                 profiles: Optional[Sequence[str]] = None, out: Optional[dict] = None,
                 values: Optional[Mapping[str, Any]] = None, case: Optional[int] = None,
                 given: Optional[Mapping[str, Any]] = None, spread_peaks: bool = False) -> Any:
        """Seeded inputs (an object with `.tensors` {name: tensor} and `.covered`); with `out` written in place.
        `given`: inputs whose values the caller fixes (a probe shaping a set as a trainer makes it); the rest
        is drawn given them, with the generator's guarantees about them (GRPO: `member_inputs`). `spread_peaks`:
        each row's largest logit a planted peak clear of the rest of its row, the rows' peaks spread over the
        vocabulary (reach's vocabulary call: `generators.spread_peaks` says why)."""
        ...

    def keep_generated(self, x: Mapping[str, "torch.Tensor"], generated: Any) -> None:
        """Keep for the reference of input set `x` what the generator computed of exactly its values
        (`generated`, what `generate` returned). The engine calls it only where the generator wrote into
        tensors no implementation can write (its pristine copies, or fresh tensors copied into them)."""
        ...

    # -- reference ---------------------------------------------------------------------------------
    def parameters(self, spec: "Spec", values: Mapping[str, Any]) -> Any:
        """The reference's parameter object for these parameter values (declared defaults for the rest)."""
        ...

    def reference_loss(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any) -> float:
        """The reduced loss in float64."""
        ...

    def policy_logprobs(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any) -> "torch.Tensor":
        """The float64 log-probs [batch, seq] of the completion ids under the policy at the parameters'
        temperature, on the CPU: what probes place old and reference log-probs from (far-ratios)."""
        ...

    def quiet_inputs(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any, seed: int
                     ) -> dict[str, "torch.Tensor"]:
        """The inputs of set `x` to replace so that its logits are quiet (RMS / T at most 2^-6), where the
        allowance of an implementation's log-probs grows with the logits (grpo-fused-linear: its GEMM in the
        operands' dtype); {} where it does not (grpo-logits: given logits). A probe whose signal is a small
        change of the log-probs' coefficients asks for it (zero-advantage's E-near)."""
        ...

    def near_tie_inputs(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any, seed: int,
                        record: dict) -> dict[str, "torch.Tensor"]:
        """A copy of input set `x` whose live tokens' ratios sit a hair from the clip bound their advantage
        decides by (relative 1e-5..4e-3, both sides), each farther from it than an honest implementation's
        log-probs may stray, so that only a branch picked in a narrower dtype crosses (the `near-ties` probe);
        `record` gets what was realised (distances, counts). Asked only where `near_tie_reason` allows."""
        ...

    def reference_gradients(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any,
                            **refinements: Any) -> dict[str, Iterator[GradientChunk]]:
        """Per differentiable input (keyed by its name), the float64 gradient chunk by chunk over units
        (`gradient_groupings`); iterators, so a chunk is computed when asked for and memory stays bounded.
        `refinements`: operation-specific extras a comparator may ask for (grpo-logits: `logp_error`)."""
        ...

    def error_model(self, spec: "Spec", x: Mapping[str, "torch.Tensor"], params: Any, dtype: str) -> Any:
        """The operation's derived allowance for these inputs in `dtype`: an object with
        `allowance(name, start, stop, unit_scale)` (each unit's absolute allowance at upstream 1, added
        to the element and Frobenius allowances) and `loss` (an absolute loss allowance); None where
        the engine derives the operation's allowances itself (grpo-logits: the fp32 log-sum-exp floors)."""
        ...

    def row_judge(self, run: Any) -> Any:
        """Asked only where `error_model` gives None (grpo-logits; an operation with an error model, as
        grpo-fused-linear, need not define it or `recheck_gradient`): the object that judges the operation's one
        gradient row by row for one workload's conformance run `run` (the engine), with allowances it derives
        from the inputs: `judge(loss, grad, x, c)` -> (loss comparison, comparator), `loss_floor(x)`,
        `row_scales(x)`, `relation(actual, expected, x, upstream, scales)`, `logp_error(x)`."""
        ...

    def recheck_gradient(self, spec: "Spec", resolved: "ResolvedWorkload", tol: Any, grad: "torch.Tensor",
                         x: Mapping[str, "torch.Tensor"], model: Any, c: float) -> Any:
        """Asked only where `error_model` gives None: a timed call's one gradient re-checked against the
        reference at `model`'s parameters, upstream `c` (a comparator with `passed`, `frobenius_rel`,
        `mismatches`, `nan`, `last_rows_nonzero`)."""
        ...

    def recheck_loss_floor(self, spec: "Spec", resolved: "ResolvedWorkload", x: Mapping[str, "torch.Tensor"],
                           model: Any) -> float:
        """Asked only where `error_model` gives None, and only when a timed call's loss misses the relative
        tolerance: the absolute allowance conformance would give that loss at `model`'s parameters (fp32's
        log-sum-exp floors and log-prob errors)."""
        ...

    def gradient_groupings(self, spec: "Spec") -> dict[str, GradientGrouping]:
        """One per gradient the spec lists, keyed by its input's name."""
        ...

    # -- work terms of the floors ------------------------------------------------------------------
    def traffic(self, spec: "Spec", resolved: "ResolvedWorkload", protocol: str, counts: Any,
                itemsize) -> tuple[list[Any], str]:
        """traffic-v1: the counted tensors `protocol` must read and write (each with tensor, direction,
        rows, shape, dtype, bytes, note) and where the declaration comes from (declared | derived).
        `counts`: what `work_counts` found in the actual inputs (or a caller's equivalent), or None."""
        ...

    def work_counts(self, tensors: Mapping[str, Any]) -> Any:
        """What of the actual input values the work terms depend on (None when only shapes matter)."""
        ...

    def gemms(self, spec: "Spec", resolved: "ResolvedWorkload", protocol: str) -> tuple[Gemm, ...]:
        """The matrix products `protocol` cannot avoid, for the GEMM ceiling; () where there are none
        (GRPO over given logits) or the protocol has no floor of its own (backward-only)."""
        ...

    def arithmetic(self, spec: "Spec", resolved: "ResolvedWorkload",
                   read: Optional[Mapping[str, int]]) -> Arithmetic:
        """`read`: elements of each input the traffic model says must be read; None: every element of
        every input, less slices the spec declares never read (headroom-v1)."""
        ...
