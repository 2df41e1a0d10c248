"""grpo-logits: the GRPO loss family over materialised logits, as a `grpo_conform.ops.interface.Operation`.

Every method delegates to the modules beside it (inputs, reference, generators, judge, traffic); nothing here
computes anything of its own, so behaviour is the pre-plug-in behaviour exactly.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Optional, Sequence

from grpo_conform import device_memory
from grpo_conform.ops.grpo_logits import traffic as _traffic
from grpo_conform.ops.grpo_logits.generators import kind_of, near_ties
from grpo_conform.ops.grpo_logits.inputs import generate, refresh_in_place
from grpo_conform.ops.grpo_logits.judge import RowJudge, recheck_gradient, recheck_loss_floor
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient, reference_logprobs, reference_loss
from grpo_conform.spec.operation_inputs import OPERATION_INPUTS
from grpo_conform.ops.interface import Arithmetic, GradientChunk, GradientGrouping, WorkloadSize

#: Spec families with an arithmetic floor: what costs one exponential per element read.
EXP_FAMILIES = {"grpo": "the log-sum-exp over the vocabulary needs exp() of every logit the loss reads"}


class GrpoLogits:
    name = "grpo-logits"
    refresh_spans_protocols = False  # a rotation keeps each row's log-sum-exp: fresh draws per protocol
    diagnosed = True  # ops/grpo_logits/diagnosis.py
    loss_scaled = True  # d logits is formed in backward: nothing stops a kernel from scaling before it rounds
    requirements = OPERATION_INPUTS["grpo-logits"]  # what a spec of it must declare (the loader checks it)
    summary = ("GRPO-family loss over given logits [batch, seq + 1, vocab] and the sampled completion ids; "
               "its gradient is d loss / d logits")

    # -- workloads ---------------------------------------------------------------------------------
    def workload_size(self, spec, resolved) -> WorkloadSize:
        x = spec.differentiable_input.name
        return WorkloadSize(x, resolved.numel(x))

    def device_bytes(self, spec, resolved) -> int:
        return device_memory.estimate(*device_memory.set_and_gradient_bytes(spec, resolved))

    def describe_workload(self, spec, resolved) -> str:
        return str(list(resolved.shapes[spec.differentiable_input.name]))

    # -- inputs ------------------------------------------------------------------------------------
    def input_kind(self, name: str) -> str:
        return kind_of(name)

    def generate(self, spec, resolved, seed: int, device, *, profiles: Optional[Sequence[str]] = None,
                 out: Optional[dict] = None, values: Optional[Mapping[str, Any]] = None, case: Optional[int] = None,
                 given: Optional[Mapping[str, Any]] = None, spread_peaks: bool = False):
        return generate(spec, resolved, seed, device, profiles=profiles, out=out, values=values, case=case, given=given,
                        spread_peaks=spread_peaks)

    def keep_generated(self, x: Mapping[str, Any], generated) -> None:
        """Nothing here: the generator's log-probs (`Inputs.logp`) go to the engine's reference cache by slot
        (`reference_cache.seed_logp`)."""

    def refresh(self, tensors: dict, rng) -> None:
        """Timed refreshes: new bytes in place, every derived relation kept (`inputs.refresh_in_place`);
        the offset comes from the timed run's OS-seeded `rng`."""
        vocab = tensors["logits"].shape[-1]
        refresh_in_place(tensors, rng.randrange(1, vocab) if vocab > 1 else 0)

    # -- reference ---------------------------------------------------------------------------------
    def parameters(self, spec, values: Mapping[str, Any]):
        return GrpoParameters.from_spec(spec, values)

    def reference_loss(self, spec, x: Mapping[str, Any], params) -> float:
        return reference_loss(x, params)

    def policy_logprobs(self, spec, x: Mapping[str, Any], params):
        return reference_logprobs(x, params).cpu()

    def quiet_inputs(self, spec, x: Mapping[str, Any], params, seed: int) -> dict:
        return {}  # the logits are given: an implementation's log-probs are judged at float32's floors already

    def near_tie_inputs(self, spec, x: Mapping[str, Any], params, seed: int, record: dict):
        # rows whose log-prob every float32 kernel computes exactly (tie_rows): ratios down to 1e-5 from a bound
        return near_ties.near_tie_inputs(spec, x, params, seed, record)

    def reference_gradients(self, spec, x: Mapping[str, Any], params,
                            logp_error=None) -> dict[str, Iterator[GradientChunk]]:
        """d loss / d logits over the flattened [batch * seq_next] rows. `logp_error` [B, S]: bounds of an
        implementation's log-prob errors; the chunks then carry the rows' coefficients and the bounds of
        how far they move (`reference.chunked_gradient`)."""
        return {spec.differentiable_input.name: reference_gradient(x, params, logp_error=logp_error)}

    def error_model(self, spec, x: Mapping[str, Any], params, dtype: str) -> None:
        """None: the row judge below derives its fp32 floors from the given logits (`judge.py`)."""
        return None

    def row_judge(self, run) -> RowJudge:
        """The judge of d logits rows for one workload's conformance run (`judge.RowJudge`)."""
        return RowJudge(run)

    def recheck_gradient(self, spec, resolved, tol, grad, x: Mapping[str, Any], model, c: float):
        """A timed call's d logits re-checked row by row at the declared defaults (`judge.recheck_gradient`)."""
        return recheck_gradient(spec, resolved, tol, grad, x, model, c)

    def recheck_loss_floor(self, spec, resolved, x: Mapping[str, Any], model) -> float:
        """A timed call's loss allowance beyond the relative tolerance (`judge.recheck_loss_floor`)."""
        return recheck_loss_floor(resolved, x, model)

    def gradient_groupings(self, spec) -> dict[str, GradientGrouping]:
        # a unit is one logits row (b, t): the softmax couples the vocabulary, never two positions
        out = {}
        for g in spec.gradients:
            shape = tuple(spec.input(g.input).shape)
            out[g.input] = GradientGrouping(g.input, shape[:-1], shape[-1:])
        return out

    # -- work terms of the floors ------------------------------------------------------------------
    def traffic(self, spec, resolved, protocol: str, counts: Any, itemsize) -> tuple[list[Any], str]:
        mask = _traffic.mask_count_for(resolved, counts)
        per_protocol, origin = _traffic.traffic_of(spec)
        return [_traffic.count_item(spec, resolved, item, mask, itemsize) for item in per_protocol.get(protocol, [])], origin

    def work_counts(self, tensors: Mapping[str, Any]) -> Optional[_traffic.MaskCount]:
        """The completion mask's counts (traffic-v1 reads only unmasked rows); None without a mask."""
        mask = tensors.get("completion_mask") if isinstance(tensors, Mapping) else None
        return _traffic.count_mask(mask) if mask is not None else None

    def gemms(self, spec, resolved, protocol: str) -> tuple:
        """None: the logits are given, every product that made them happened before the call."""
        return ()

    def arithmetic(self, spec, resolved, read: Optional[Mapping[str, int]]) -> Arithmetic:
        """One exponential per element of the differentiable input the call reads."""
        family = spec.semantics.family
        if family not in EXP_FAMILIES:
            return Arithmetic(0, f"no arithmetic formula for family {family!r}")
        x = spec.differentiable_input
        if read is not None:  # traffic-v1: the elements that must be read
            count = read.get(x.name, 0)
            if not count:
                return Arithmetic(0, f"no exponential needed: {x.name} need not be read")
            return Arithmetic(count, f"{count:,} exp ({x.name} elements that must be read; {EXP_FAMILIES[family]})")
        shape = resolved.shapes[x.name]  # headroom-v1: every element, less slices never read
        count = math.prod(shape)
        dims = " x ".join(map(str, shape))
        for g in spec.gradients:
            if g.input == x.name and g.exact_zero is not None:
                extent = shape[list(x.shape).index(g.exact_zero.axis)]
                count = count // extent * (extent - 1)
                dims += f" less the {g.exact_zero.axis}[{g.exact_zero.index}] slice, never read"
        return Arithmetic(count, f"{count:,} exp ({x.name} {dims}; {EXP_FAMILIES[family]})")


GRPO_LOGITS = GrpoLogits()
