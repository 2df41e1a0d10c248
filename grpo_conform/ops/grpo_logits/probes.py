"""The probes only grpo-logits runs (issue 30): each changes or compares rows of the given logits (one
row per (sequence, position), the vocabulary along it), so an operation that gives no logits (grpo-fused-linear)
lists their checks as not applicable, saying why (`applies`). The probe registry (`checks/probes.py`) lists
them in its order; their judging is `judging.py` beside this file. Moved unchanged from `checks/probes.py`.

advantage-sign (C against A), row-locality (F), last-row (G), masked-positions (M), exact-ties (T), near-ties
(T-near) and far-ratios (W); `ties_unsupported` tells the declared-cases probe where tie cases cannot be built.
near-ties and far-ratios run for grpo-fused-linear too: far-ratios changes only the [B, S] log-probs, placed
from the operation's own log-probs (`Operation.policy_logprobs`; a log-ratio clamped at 20 passed the fused
check before, docs/checks.md); near-ties asks the operation for its inputs (`Operation.near_tie_inputs`).
"""

from __future__ import annotations

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, Probe, WorkloadConformance
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.ops import operation_name
from grpo_conform.ops.grpo_logits import judging as L
from grpo_conform.ops.grpo_logits.declared_cases import record
from grpo_conform.ops.grpo_logits.generators.logprob_gaps import (far_ratio_inputs, sampling_product_inputs,
                                                              vespo_clamp_inputs)
from grpo_conform.ops.grpo_logits.generators.near_ties import NEAR_MAX, NEAR_MIN, near_tie_reason
from grpo_conform.ops.grpo_logits.member_inputs import exact_tie_inputs
from grpo_conform.spec import Spec


#: the [batch, seq] inputs and advantages far-ratios rewrites (the fused operation's call writes only these)
GRIDS = ("completion_ids", "completion_mask", "advantages", "old_logprobs", "ref_logprobs")


def _inputs(spec: Spec) -> set[str]:
    return {t.name for t in spec.inputs}


def advantage_sign(run: WorkloadConformance) -> None:
    """C against A: negating the advantages negates the gradient (read from C's output slot, which
    no call has exported into since: this probe follows negated-advantages)."""
    c, slot = run.state.pop("C", (None, None))
    if c is None or "A" not in run.state:
        run.book.skip("advantage-sign", "call A or call C did not complete")
        return
    if run.exported.get(slot) != c.label:  # a registry order that lets another call overwrite C's outputs
        raise RuntimeError("probe advantage-sign must follow negated-advantages directly (ops/grpo_logits/probes.py)")
    L.advantage_sign(run, c, run.state["A"][1])


def _symmetric(spec: Spec) -> str | None:
    """Why negating A does not negate this member's gradient (None where it does)."""
    names = _inputs(spec)
    if "old_logprobs" in names:
        return ("not a symmetry of this member: with old log-probs, negating A changes which clip branch "
                "is active (call C is still judged against the reference: freshness)")
    if {"ref_logprobs", "ref_weight"} & names:
        return "not a symmetry of this member: the KL term does not depend on A"
    return None


def _masked(spec: Spec) -> str | None:
    return None if "completion_mask" in _inputs(spec) else "this member has no completion mask"


_LOGITS_ONLY = {  # probe -> why it needs given logits (what it changes or compares is a logits row)
    "advantage-sign": "compares d logits rows with their per-row scale (call C is still judged against the reference)",
    "row-locality": "redraws one logits row",
    "last-row": "poisons the left-over logits position, which this operation does not have",
    "masked-positions": "redraws the logits of masked positions (their d logits rows must be exactly 0)",
    "exact-ties": "builds exact clip ties from the given logits' log-probs",
    "far-ratios": "sets old and reference log-probs from the given logits' log-probs",
}


def _logits_only(spec: Spec, probe: str = "") -> str | None:
    """Why a probe that changes or compares given logits does not apply (None for grpo-logits)."""
    op = operation_name(spec)
    if op == "grpo-logits":
        return None
    return f"grpo-logits only: this probe {_LOGITS_ONLY.get(probe, 'works on given logits')}; {op} gives none"


def _only_logits(probe: str, then=None):
    def applies(spec: Spec) -> str | None:
        return _logits_only(spec, probe) or (then(spec) if then else None)
    return applies


def _clipped(spec: Spec) -> str | None:
    if {"epsilon_low", "epsilon_high"} <= {p.name for p in spec.parameters}:
        return None
    return "this spec declares no clip (no epsilon_low / epsilon_high)"


def _off_policy(spec: Spec) -> str | None:
    return None if "old_logprobs" in _inputs(spec) else "this member has no old log-probs: its ratio is exactly 1"


def _off_policy_clipped(spec: Spec) -> str | None:
    return _off_policy(spec) or _clipped(spec)


def row_locality(run: WorkloadConformance) -> None:
    """F: D's inputs with one logits row redrawn: only that gradient row may change."""
    if "D" not in run.state:
        run.book.skip("row-locality", "call D did not complete")
        return
    L.row_locality(run, *run.state["D"][::2])


def last_row(run: WorkloadConformance) -> None:
    """G: D's inputs with logits[:, S, :] poisoned (NaN, then huge): no output may change."""
    if "D" not in run.state:
        run.book.skip("last-row-ignored", "call D did not complete")
        return
    L.last_row(run, *run.state["D"])


def masked_positions(run: WorkloadConformance) -> None:
    """M: masked positions get an exactly zero gradient, and redrawing their logits (finite
    values) changes no output."""
    if "D" not in run.state:
        run.book.skip("masked-positions", "call D did not complete")
        return
    L.masked_positions(run, *run.state["D"])


def exact_ties(run: WorkloadConformance) -> None:
    """T: every token at an exact tie of the clip, in the kernel's float32 arithmetic and in the
    float64 reference (member_inputs.exact_tie_inputs): the spec gives the gradient to the
    unclipped branch; a kernel that hands ties to the clipped one returns 0 there."""
    check = "exact-ties"
    seed = run.seeds[0] ^ 0x71E5
    run.generate(run.P, seed)
    x, values = exact_tie_inputs(run.spec, run.P.pristine, run.model.values, seed)
    run.P.write(x)
    run.draws["exact_ties"] = {k: values[k] for k in ("epsilon_low", "epsilon_high")}
    cispo = values.get("loss_type") == "cispo"  # exact_tie_inputs puts CISPO's cap (epsilon_high) at r = 1
    record(run.draws, "ties", "tie at the cap, epsilon_high = 1" if cispo else "tie at both epsilon bounds")
    drawn, run.model = run.model, ReferenceModel(run.spec, values)  # the call and its reference use these
    try:
        t = run.call("T", run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
        if t is not None:
            J.finite(run, t)
            J.versus_reference(run, check, t, "every token at an exact tie, epsilon_low {:g}, epsilon_high {:g}".format(
                values["epsilon_low"], values["epsilon_high"]))
    finally:
        run.model = drawn


SEQUENCE_CALLS = 6  # T-near calls of a sequence-level member (one ratio per sequence): with 3, the gallery
# folder gspo-branch-from-ratio-in-logits-dtype passed about 1 run in 5 once the other probes moved its sets (run 199)


def near_ties(run: WorkloadConformance) -> None:
    """T-near: every live ratio at its clip bound times (1 + d), both sides, each token farther from its bound
    than an honest implementation's log-probs may stray (`Operation.near_tie_inputs`: on the logits operation
    rows every float32 kernel computes exactly, |d| 1e-5 to 4e-3; on the fused one the logits quieted first,
    |d| from twice the token's allowance; at sequence level (GSPO) one distance per sequence, six calls): a
    branch picked from a ratio rounded to a narrower dtype flips on about a third of the tokens."""
    check = "near-ties"
    reason = near_tie_reason(run.model.params, _inputs(run.spec))
    if reason is not None:  # the drawn parameters leave no hard clip bound to sit beside
        run.book.not_applicable(check, reason)
        return
    # A sequence-level member has one ratio per sequence: a call's few sequences (4-8 at the CPU workloads) may all
    # miss a narrow dtype's rounding band (its width at the drawn bound is 0 to 0.33%), so it makes SEQUENCE_CALLS calls.
    calls = SEQUENCE_CALLS if run.model.params.importance_sampling_level == "sequence" else 1
    run.draws["near_ties"] = []
    record(run.draws, "ties", "ratios within 1e-5..4e-3 of the bound on both sides")
    labels = ["T-near"] + [f"T-near-{i + 1}" for i in range(1, calls)]
    # and once at the declared defaults (equal epsilons, T = 1: the drawn epsilons are never equal), where a
    # kernel specialising a symmetric clip (one EPS, the trust region in log space, 1 / (1 + EPS) for 1 - EPS)
    # differs only near the lower bound (the thirty-sixth session's round); in every dtype via other-dtypes
    drawn = run.model
    defaults = ReferenceModel(run.spec, dict(run.spec.parameter_values))
    if near_tie_reason(defaults.params, _inputs(run.spec)) is None:
        # one sequence a call: both signs of its advantage, one call each (mix_signs alternates with the seed)
        labels += ["T-near-defaults"] + (["T-near-defaults-2"] if run.P.tensors["advantages"].shape[0] == 1 else [])
    try:
        for i, label in enumerate(labels):
            if label.startswith("T-near-defaults"):
                run.model = defaults  # the inputs and the reference follow the call's parameters
            seed = run.seeds[0] ^ 0x71E5 ^ 0x4E ^ (i * 0x9E37)
            run.generate(run.P, seed)
            near: dict = {"call": label}
            run.P.write(run.op.near_tie_inputs(run.spec, run.P.pristine, run.model.params, seed, near))
            run.draws["near_ties"].append(near)
            t = run.call(label, run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
            if t is None:
                return
            J.finite(run, t)
            J.versus_reference(run, check, t, f"every ratio at its clip bound times (1 + d), |d| up to {NEAR_MAX:g} "
                                              f"(at least {NEAR_MIN:g} and beyond the log-probs' allowance), both "
                                              "sides: a branch picked in a narrower dtype flips" +
                                              (" (the declared defaults)" if "defaults" in label else ""))
    finally:
        run.model = drawn


def far_ratios(run: WorkloadConformance) -> None:
    """W: every token's ratio far out on its unclipped side (3 to e^25 for A < 0, e^-25 to 0.3 for
    A > 0; both signs present; reference log-probs up to 25 from logp on both sides;
    generators.logprob_gaps.far_ratio_inputs), the parameters as drawn: a clip the member does not
    declare (PPO's dual clip at 3) or a log-ratio or KL gap clamped for safety (verl: 20, 10) shows
    only there. W-vespo (VESPO members): one token beyond the per-token clamp, the row's others on the other
    side (`vespo_clamp_inputs`): a far row pushed one way hides that clamp behind the sum's. W-vllm (vLLM
    sequence modes): each row's sampling ratios swing its partial log-sum out of float32's range and back
    (`sampling_product_inputs`): a running product of the ratios is 0 or inf there."""
    check = "far-ratios"
    seed = run.seeds[0] ^ 0xFA2
    run.generate(run.P, seed)
    reach: dict = {}
    x = run.P.pristine
    if "logits" in x:
        run.P.write(far_ratio_inputs(run.spec, x, run.model.values, seed, reach))
    else:  # the fused operation: its log-probs from the lm_head, only the [B, S] grids rewritten
        logp = run.op.policy_logprobs(run.spec, x, run.model.params)
        grids = {k: x[k] for k in GRIDS if k in x}
        run.P.write(far_ratio_inputs(run.spec, grids, run.model.values, seed, reach, logp, x["hidden"].dtype))
    run.draws["far_gaps"] = reach  # [min, max] of log r (and ref - logp) over the live tokens
    w = run.call("W", run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
    if w is not None:
        J.finite(run, w)
        J.versus_reference(run, check, w, "every ratio far out on its unclipped side: 3 to e^25 for A < 0, "
                                          "e^-25 to 0.3 for A > 0" + (", ref - logp to +-25" if "ref_gap" in reach else ""))
    # VESPO's per-token clamp behind the sum's (logprob_gaps.vespo_clamp_inputs)
    if run.model.values.get("loss_type") == "vespo" and "logits" in x:
        run.generate(run.P, seed ^ 0x7E5)
        mixed: dict = {}
        run.P.write(vespo_clamp_inputs(run.spec, run.P.pristine, run.model.values, seed, mixed))
        run.draws["vespo_clamp"] = mixed
        v = run.call("W-vespo", run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
        if v is not None and mixed["rows"]:
            J.finite(run, v)
            J.versus_reference(run, check, v, "a token 2-5 beyond VESPO's per-token clamp (+-20) in each row, the "
                                              "row's other tokens on the other side")
    # vLLM's sequence weight as exp of the summed logs, not a float32 running product (sampling_product_inputs)
    if str(run.model.values.get("vllm_importance_sampling_mode", "")).startswith("sequence") and "logits" in x:
        run.generate(run.P, seed ^ 0x5A3)
        swung: dict = {}
        run.P.write(sampling_product_inputs(run.spec, run.P.pristine, run.model.values, seed, swung))
        run.draws["sampling_product"] = swung
        q = run.call("W-vllm", run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
        if q is not None and swung["rows"]:
            J.finite(run, q)
            J.versus_reference(run, check, q, "each row's sampling ratios swinging its partial log-sum to +-112 "
                                              "and back: the sequence weight is exp of the sum")


def ties_unsupported(spec: Spec) -> str | None:
    """Why exact ties cannot be built for this spec's operation (None for grpo-logits): the declared-cases
    probe leaves its tie cases out with this reason (`exact-ties` not applicable)."""
    return _logits_only(spec, "exact-ties")


ADVANTAGE_SIGN = Probe("advantage-sign", advantage_sign.__doc__, advantage_sign, ("advantage-sign",),
                       ("advantage-sign",), _only_logits("advantage-sign", _symmetric),
                       ("baseline", "negated-advantages"))
ROW_LOCALITY = Probe("row-locality", row_locality.__doc__, row_locality, CALL + ("row-locality", "finite"),
                     ("row-locality",), _only_logits("row-locality"), needs=("new-buffers",))
LAST_ROW = Probe("last-row", last_row.__doc__, last_row, CALL + ("last-row-ignored",), ("last-row-ignored",),
                 _only_logits("last-row"), needs=("new-buffers",))
MASKED_POSITIONS = Probe("masked-positions", masked_positions.__doc__, masked_positions,
                         CALL + ("masked-positions", "finite"), ("masked-positions",),
                         _only_logits("masked-positions", _masked), ("new-buffers",))
EXACT_TIES = Probe("exact-ties", exact_ties.__doc__, exact_ties, CALL + ("exact-ties", "finite"), ("exact-ties",),
                   _only_logits("exact-ties", _clipped))
NEAR_TIES = Probe("near-ties", near_ties.__doc__, near_ties, CALL + ("near-ties", "finite"), ("near-ties",),
                  _off_policy_clipped)
FAR_RATIOS = Probe("far-ratios", far_ratios.__doc__, far_ratios, CALL + ("far-ratios", "finite"), ("far-ratios",),
                   _off_policy)
