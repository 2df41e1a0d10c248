"""grpo-fused-linear: the lm_head GEMM fused with a GRPO-family loss, as a `grpo_conform.ops.interface.Operation`.

What a call computes: logits = hidden @ weight.T (+ bias) over [B, T] positions, never materialised in
the reference; log-probs of the completion ids at temperature T; the shared GRPO terms; gradients of
hidden, weight and bias (`reference.py`). The input layout and the values drawn: `inputs.py`.

Work terms (floors): the three GEMMs a fused kernel cannot avoid are 2NHV FLOPs each (N = B*T rows):
the logits in forward, d hidden and d weight in backward, so forward needs 2NHV and full 6NHV
(a kernel that recomputes the logits in backward does 8NHV; the floor counts what cannot be avoided).
A reference weight (KL through a second lm_head) adds 2NHV to both. One exponential per logit
(N*V, again per reference logit). Traffic: every input read once, the loss written; full also writes
each gradient once (logits never need to cross DRAM: that is what fusing buys).
Forward of a member whose loss value does not read the log-probs (`value_reads_logprobs`: no old
log-probs, no KL, no CISPO weight; the ratio is exactly 1, so the loss is a function of the advantages
and the mask) needs no GEMM, no exponential and none of hidden, weight, bias or the ids: counting them
made the first H200 record of an honest kernel "below the floor" (0.089 ms against 0.247 at seed-b16).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Optional, Sequence

from grpo_conform import device_memory
from grpo_conform.ops.fused_linear import inputs as _inputs
from grpo_conform.ops.fused_linear import near_ties as _near_ties
from grpo_conform.ops.fused_linear import reference as _reference
from grpo_conform.ops.fused_linear.tolerance import gemm_allowance
from grpo_conform.ops.grpo_logits.traffic import Counted
from grpo_conform.ops.grpo_terms import GrpoParameters, needs_logprobs
from grpo_conform.spec.operation_inputs import OPERATION_INPUTS
from grpo_conform.ops.interface import Arithmetic, Gemm, GradientChunk, GradientGrouping, WorkloadSize

INPUT_KINDS = {
    "hidden": "hidden-states", "ref_hidden": "hidden-states", "weight": "lm-head-weight",
    "ref_weight": "lm-head-weight", "bias": "lm-head-bias", "ref_bias": "lm-head-bias",
    "completion_ids": "token-ids", "advantages": "sequence-scalar", "completion_mask": "mask",
    "old_logprobs": "token-logprobs", "ref_logprobs": "token-logprobs",
}
PROTOCOLS = ("forward", "full", "full-scaled", "backward")


class UnsupportedProtocol(ValueError):
    """A protocol this operation has no work terms for."""


# inputs the loss value reads even when the log-probs do not matter (the ratio is exactly 1)
_VALUE_ONLY_INPUTS = ("advantages", "completion_mask")


def value_reads_logprobs(spec) -> bool:
    """Whether the loss value (not its gradient) depends on the log-probs at the spec's declared
    parameters: the shared rule (`grpo_terms.needs_logprobs`: old log-probs, CISPO, a KL term over given
    reference log-probs) plus this operation's reference lm_head, or any declared KL term."""
    names = dict.fromkeys(t.name for t in spec.inputs)
    return (needs_logprobs(names, GrpoParameters.from_spec(spec)) or "ref_weight" in names
            or spec.terms.kl.present)


def _dims(resolved) -> tuple[int, int, int]:
    """(N rows = B*T, H, V) of a resolved workload."""
    batch, seq, hidden = resolved.shapes["hidden"]
    return batch * seq, hidden, resolved.shapes["weight"][0]


class GrpoFusedLinear:
    name = "grpo-fused-linear"
    diagnosed = False  # the neighbouring semantics are written over logits (ops/grpo_logits/diagnosis.py)
    # The gradients are formed in forward by design (the logits die chunk by chunk; Liger folds in 1, ours the
    # last upstream): in float16 what lies below the range at the folded scalar is gone whatever the real one,
    # so a loss scale would judge the design, not the semantics (docs/checks.md, "float16 and the other declared dtypes")
    loss_scaled = False
    requirements = OPERATION_INPUTS["grpo-fused-linear"]  # what a spec of it must declare (the loader checks it)
    summary = ("GRPO-family loss over hidden states [batch, seq, hidden] times an lm_head weight [vocab, hidden] "
               "(+ bias), logits never given; its gradients are d loss / d hidden, weight and bias")

    # -- workloads ---------------------------------------------------------------------------------
    def workload_size(self, spec, resolved) -> WorkloadSize:
        # the larger of the two GEMM operands sizes buffers and timeouts (the weight at every seed shape)
        name = max(("hidden", "weight"), key=resolved.numel)
        return WorkloadSize(name, resolved.numel(name))

    def device_bytes(self, spec, resolved) -> int:
        # beside the sets: the logits no input holds, [N, V] in fp32, and their gradient, twice over (an
        # eager implementation's and the float64 reference's chunks stay within the fixed part)
        n, _h, v = _dims(resolved)
        return device_memory.estimate(*device_memory.set_and_gradient_bytes(spec, resolved)) + 4 * n * v * 4

    def describe_workload(self, spec, resolved) -> str:
        n, h, v = _dims(resolved)
        bias = " + bias" if "bias" in resolved.shapes else ""
        return f"hidden {list(resolved.shapes['hidden'])} x weight [{v}, {h}]{bias}"

    # -- inputs ------------------------------------------------------------------------------------
    def input_kind(self, name: str) -> str:
        try:
            return INPUT_KINDS[name]
        except KeyError:
            raise KeyError(f"input {name!r} has no kind in grpo-fused-linear (known inputs: "
                           f"{', '.join(sorted(INPUT_KINDS))})") from None

    def generate(self, spec, resolved, seed: int, device, *, profiles: Optional[Sequence[str]] = None,
                 out: Optional[dict] = None, values: Optional[Mapping[str, Any]] = None, case: Optional[int] = None,
                 given: Optional[Mapping[str, Any]] = None, spread_peaks: bool = False):
        return _inputs.generate(spec, resolved, seed, device, profiles=profiles, out=out, values=values, case=case,
                                given=given, spread_peaks=spread_peaks)

    def keep_generated(self, x: Mapping[str, Any], generated) -> None:
        """The generator's row pass (members with old or reference log-probs) kept for the judge of `x`:
        one float64 pass over [N, V] fewer for every fresh input set of those members."""
        if generated.rows is not None:
            _reference.keep_generated(x, generated.rows_temperature, generated.rows)

    #: The timed protocols keep a slot's full draw across the three of them (checks/timed.py `_refresh`):
    #: a timed workload draws 5 full input sets (4 buffer sets and the warm set) instead of 15.
    refresh_spans_protocols = True

    def refresh(self, tensors: dict, rng) -> None:
        """Timed refreshes: new bytes in place on the device, no host draw (`inputs.refresh_in_place`);
        the offset and the seed come from the timed run's OS-seeded `rng`.

        Why a slot's full draw may serve all three timed protocols (`refresh_spans_protocols`), and why a
        cache across protocols still cannot profit from it: every refresh moves every byte of the large
        inputs (the vocabulary rotated by an offset, the hidden dimension permuted, both drawn from the
        OS-seeded `rng`) and changes every row's logits as a set (fresh row scales: its log-sum-exp
        moves), so no call of a protocol sees values that a call of an earlier protocol saw. The first
        pass of a protocol is then a refresh of the last pass of the one before, exactly as every pass
        within a protocol already was of the pass before it (five refreshes follow each full draw there):
        a cache keyed by address, by content or by a row's values up to order meets the same relation,
        only more often. The warm set is refreshed at each protocol's start too, so the identical calls of
        the `caching` check repeat values no other protocol ran. What survives the refreshes (masks, old
        and reference log-probs, the ids up to the rotation) are inputs, not results: a kernel answering
        from results keyed on them returns the loss of other values, which the re-checks (three a
        protocol, against the reference of the values the call ran on) catch. Timing is unaffected: the
        fused work is counted from shapes only (`work_counts` is None), so fewer distinct masks (5, not
        15, a timed workload) move no floor.

        What the longer chain changes: each refresh scales each hidden row (and each advantage) by e^u, u
        uniform in [-0.1, 0.1], so after a slot's last refresh the product is e^v with |v| <= 0.1 times the
        refreshes (17 with 4 buffer sets: 3 protocols x (1 warmup + 5 timed passes), less the draw; 32 with
        the 2 sets of a short device) and std 0.058 x sqrt(refreshes): 0.24 for 17, against 0.13 for the 5
        of one protocol. A wide row's log-probs then move by up to a few tens, all finite
        (tests/test_fused_draws.py refreshes a set 32 times)."""
        vocab = tensors["weight"].shape[0]
        _inputs.refresh_in_place(tensors, rng.randrange(1, vocab) if vocab > 1 else 0, rng.getrandbits(63))

    # -- reference ---------------------------------------------------------------------------------
    def parameters(self, spec, values: Mapping[str, Any]) -> GrpoParameters:
        return GrpoParameters.from_spec(spec, values)

    def reference_loss(self, spec, x: Mapping[str, Any], params) -> float:
        return _reference.reference_loss(x, params)

    def policy_logprobs(self, spec, x: Mapping[str, Any], params):
        # the memoised row pass: on a set just generated, the one the generator made (`keep_generated`)
        return _reference.row_stats(x, params).logp.reshape(x["completion_ids"].shape).cpu()

    def quiet_inputs(self, spec, x: Mapping[str, Any], params, seed: int) -> dict:
        # the GEMM's log-prob allowance grows with the logits (~2^-8 |z| in bf16): scaled down to RMS/T 2^-6
        return _near_ties.quiet_inputs(x, params, seed)

    def near_tie_inputs(self, spec, x: Mapping[str, Any], params, seed: int, record: dict):
        # the logits quieted first, so that the GEMM's allowance stays under the distances (near_ties.py)
        return _near_ties.near_tie_inputs(spec, x, params, seed, record)

    def reference_gradients(self, spec, x: Mapping[str, Any], params, **refinements) -> dict[str, Iterator[GradientChunk]]:
        """Chunks of d hidden (rows b, t), d weight (vocabulary rows) and d bias (entries), for the
        gradients the spec lists. No refinements yet (the fp32 log-prob bound is grpo-logits')."""
        if refinements:
            raise TypeError(f"grpo-fused-linear takes no refinements (got {sorted(refinements)})")
        wanted = {g.input for g in spec.gradients}
        return {k: v for k, v in _reference.reference_gradients(x, params).items() if k in wanted}

    def error_model(self, spec, x: Mapping[str, Any], params, dtype: str):
        """The allowance for the lm_head GEMM's rounding in `dtype` (`tolerance.gemm_allowance`)."""
        return gemm_allowance(x, params, dtype)

    def gradient_groupings(self, spec) -> dict[str, GradientGrouping]:
        # hidden: a unit is one position (b, t), its H elements; weight: one vocabulary row, its H
        # elements; bias: one vocabulary entry (width 1). Each unit's scale bounds its elements.
        out = {}
        for g in spec.gradients:
            shape = tuple(spec.input(g.input).shape)
            out[g.input] = GradientGrouping(g.input, shape[:1], ()) if len(shape) == 1 else \
                GradientGrouping(g.input, shape[:-1], shape[-1:])
        return out

    def explore_workload(self, session, spec, cases: int, impl):
        raise NotImplementedError("check --explore has no grpo-fused-linear cases yet (issue 31)")

    # -- work terms of the floors ------------------------------------------------------------------
    def traffic(self, spec, resolved, protocol: str, counts: Any, itemsize) -> tuple[list[Any], str]:
        """Every input read once; the loss written; full and full-scaled also write every gradient.
        backward has no floor of its own (floors.py says why): nothing counted."""
        if protocol not in PROTOCOLS:
            raise UnsupportedProtocol(f"grpo-fused-linear: no traffic for protocol {protocol!r} (one of {PROTOCOLS})")
        if protocol == "backward":
            return [], "derived"
        items = []
        value_only = protocol == "forward" and not value_reads_logprobs(spec)
        for t in spec.inputs:
            if value_only and t.name not in _VALUE_ONLY_INPUTS:
                continue  # the loss is a function of the advantages (and the mask): nothing else is read
            dtype = resolved.dtypes.get(t.name) or min(t.dtypes, key=itemsize)
            shape = tuple(resolved.shapes[t.name])
            items.append(Counted(t.name, "read", "all", shape, dtype, math.prod(shape) * itemsize(dtype)))
        for o in spec.outputs:
            dtype = min(o.dtypes, key=itemsize)
            shape = tuple(resolved.axes[a] for a in o.shape)
            items.append(Counted(o.name, "write", "all", shape, dtype, math.prod(shape) * itemsize(dtype)))
        if protocol in ("full", "full-scaled"):
            for g in spec.gradients:
                dtype = resolved.dtypes.get(g.input) or min(spec.input(g.input).dtypes, key=itemsize)
                shape = tuple(resolved.shapes[g.input])
                items.append(Counted(f"grad:{g.input}", "write", "all", shape, dtype, math.prod(shape) * itemsize(dtype)))
        return items, "derived"

    def work_counts(self, tensors: Mapping[str, Any]) -> None:
        return None  # a masked position still needs its logits row for the GEMMs' shapes: only shapes matter

    def gemms(self, spec, resolved, protocol: str) -> tuple[Gemm, ...]:
        """The GEMMs `protocol` cannot avoid, in the hidden states' dtype (see the module docstring):
        forward the logits (and the reference logits, with a reference weight); full and full-scaled
        also d hidden = d logits W and d weight = d logits^T hidden; backward-only none (the seed's
        protocol times autograd's accumulation: work can move into forward)."""
        if protocol == "backward" or (protocol == "forward" and not value_reads_logprobs(spec)):
            return ()
        n, h, v = _dims(resolved)
        dtype = resolved.dtypes.get("hidden", "bfloat16")
        # operands: the inputs whose values the ceiling multiplies (d logits has none: drawn); rows: the
        # dimension over the N rows, along which a kernel may chunk (d weight's sum runs over them)
        out = [Gemm(n, h, v, dtype, "logits = hidden weight^T", "b", ("hidden", "weight"), "m")]
        if protocol in ("full", "full-scaled"):
            out += [Gemm(n, v, h, dtype, "d hidden = d logits weight", "", ("", "weight"), "m"),
                    Gemm(v, n, h, dtype, "d weight = d logits^T hidden", "a", ("", "hidden"), "k")]
        names = {t.name for t in spec.inputs}
        if "ref_weight" in names:
            ref_hidden = "ref_hidden" if "ref_hidden" in names else "hidden"
            out.append(Gemm(n, h, v, dtype, "reference logits = hidden ref_weight^T", "b", (ref_hidden, "ref_weight"),
                            "m"))
        return tuple(out)

    def flops(self, spec, resolved, protocol: str) -> tuple[int, str]:
        """GEMM FLOPs `protocol` cannot avoid (2NHV per GEMM; see the module docstring)."""
        n, h, v = _dims(resolved)
        if protocol == "backward":
            return 0, "backward: no floor of its own (work can move into forward)"
        gemms = self.gemms(spec, resolved, protocol)
        if not gemms:
            return 0, f"{protocol}: none (the ratio is exactly 1: the loss value reads no log-probs)"
        what = ", ".join(g.what.split(" =")[0] for g in gemms)
        return sum(g.flops for g in gemms), f"{len(gemms)} GEMMs of 2NHV = 2 x {n} x {h} x {v} FLOPs ({what})"

    def arithmetic(self, spec, resolved, read: Optional[Mapping[str, int]], protocol: str = "full") -> Arithmetic:
        """One exponential per logit (per reference logit too) and the protocol's GEMM FLOPs."""
        n, _h, v = _dims(resolved)
        logits = n * v * (2 if any(t.name == "ref_weight" for t in spec.inputs) else 1)
        flops, flop_text = self.flops(spec, resolved, protocol)
        if read is not None and "weight" not in read:
            # traffic-v1 reads no weight exactly when the loss value reads no log-probs (forward, ratio 1)
            return Arithmetic(0, "no exp (the loss value reads no log-probs)", flops, flop_text)
        return Arithmetic(logits, f"{logits:,} exp (one per logit: the log-sum-exp over the vocabulary)",
                          flops, flop_text)


GRPO_FUSED_LINEAR = GrpoFusedLinear()
