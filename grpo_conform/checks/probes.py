"""The conformance probes: small named steps, each saying how it changes the inputs or the call,
which checks it feeds, where it applies (`applies(spec)`: None, or why the member rules it out)
and which earlier probes it needs. A workload's profile (`full`, `core`, `smoke`) lists the probes
it runs, in order; `PROBES_BY_NAME` is the registry (it also feeds docs/checks.md), and `select`
narrows a profile to the probes that feed the checks `-k` asks for, before anything runs. The
engine (conformance.py) is handed the selection: it does not import this module.

The probes here are the generic ones; an operation's own probes live with it and this registry lists
them in its one order (the order fixes every call label and every draw of a run): `ops/grpo_probes.py`
(every GRPO operation: negated-advantages, zero-advantage) and `ops/grpo_logits/probes.py` (the
logits-only ones), each with its `applies`. The registry imports them, never the other way: an operation
object cannot carry its probes itself, since the probes import the engine, which imports the operations.

Buffer sets: P and Q are the two input sets (different addresses); O1 and O2 the parent-owned
output slots. Probes pass results to later probes through `run.state` (e.g. the gradient of the
baseline call, which the metamorphic probes compare with).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from grpo_conform.checks import judging as J
from grpo_conform.checks import graphs, patterns
from grpo_conform.checks.reach import reach
from grpo_conform.checks.rewritten import rewritten_inputs
from grpo_conform.checks import other_dtypes
from grpo_conform.checks.upstreams import draw_upstream, gradient_bound
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.trainer_modes import TRAINER_MODES
from grpo_conform.ops import grpo_probes as G
from grpo_conform.ops.grpo_mask_runs import MASK_RUNS
from grpo_conform.ops.one_input import ONE_INPUT
from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits import probes as L
from grpo_conform.ops.grpo_logits.declared_cases import declared_calls, record, tie_value
from grpo_conform.ops.grpo_logits.member_inputs import exact_tie_inputs, tie_ratio
from grpo_conform.ops.fused_linear.probes import FUSED_PROBES
from grpo_conform.ops.fused_linear.value_probes import VALUE_PROBES
from grpo_conform.ops.grpo_shared_inputs import SHARED_INPUTS
from grpo_conform.ops.grpo_views import audible_scalars
from grpo_conform.checks.permuted import PERMUTED
from grpo_conform.ops.grpo_logits.probes import ties_unsupported
from grpo_conform.spec import Spec




def baseline(run: WorkloadConformance) -> None:
    """A: seed 1 in P, allocator poisoned with NaN; B: same inputs, huge finite poison."""
    run.generate(run.P, run.seeds[0])
    a = run.call("A", run.P, run.out1, PLAIN + ("stale-output",), poison="nan")
    if a is not None:
        J.plain(run, a)
        J.finite_under_poison(run, a)
        run.state["A"] = (a.label, _saved(a), a.loss)
    b = run.call("B", run.P, run.out1, ("stale-output", "determinism", "finite"), poison="huge")
    if b is not None:
        J.stale_huge(run, b)
        J.finite(run, b)
        if "A" in run.state:
            J.determinism(run, run.state["A"][1], run.state["A"][2], b)


def _saved(call):
    """A call's gradient kept for later probes: the tensor itself with one gradient (the logits probes
    index it), a dict by name with several (determinism and re-reads compare each by name)."""
    if len(call.grads) == 1:
        return call.grad.clone()
    return {n: g.clone() for n, g in call.grads.items()}


def _has_mask(spec: Spec) -> str | None:
    kind = operation_for(spec).input_kind
    if any(kind(t.name) == "mask" for t in spec.inputs):
        return None
    return "nothing to mask: the ordinary input sets already hold every case of this member's inputs"


def new_buffers(run: WorkloadConformance) -> None:
    """D: seed 2 in Q (new addresses, new values)."""
    Q = run.Q
    run.generate(Q, run.seeds[1 % len(run.seeds)])
    d = run.call("D", Q, run.out2, PLAIN + ("freshness",))
    if d is not None:
        J.plain(run, d)
        J.fresh(run, d, "new buffers, new values")
        run.state["D"] = (_saved(d), d.loss, 1.0)
    if "A" in run.state:
        J.reread_first(run, "after D")


def declared(run: WorkloadConformance, only=None) -> None:
    """K: one call per declared case (grpo_conform.declared_cases): every parameter at its default
    exactly (temperature 1.0), all at the low ends of their ranges, all at the high ends, each of the
    member's named cases and equalities, each tie its cases name (every ratio exactly on that
    bound, as `exact-ties` builds them), and the mixed ends (every pair of parameters at each
    combination of its ends). The random draws never reach these values."""
    drawn = run.model
    try:
        rng = run.rng if only is None else random.Random(f"{run.seeds[-1]}:declared-defaults")  # run.rng unmoved
        for i, dc in enumerate(declared_calls(run.spec, rng)):
            if only is not None and not only(dc):
                continue
            seed = run.seeds[i % len(run.seeds)] ^ (0xDC00 + i)
            run.model = ReferenceModel(run.spec, dict(dc.values))  # inputs follow the call's parameters
            run.generate(run.P, seed)
            if dc.audible:  # the above-draws calls: every row with tokens audible, as a pattern's one call (a hard
                # clip read as CISPO's raw bound past epsilon_high 1 showed in 67% of sets, 85% with this)
                run.P.write(audible_scalars(run, run.P))
            check, values = "declared-cases", dict(dc.values)
            if dc.tie is not None and ties_unsupported(run.spec):  # ties are built from the operation's inputs
                run.book.not_applicable("exact-ties", ties_unsupported(run.spec))
                continue
            if dc.tie is not None:
                check = "exact-ties"
                x, _ = exact_tie_inputs(run.spec, run.P.pristine, values, seed)
                values[dc.tie.parameter] = tie_value(dc.tie.bound, tie_ratio(run.spec, x, values))
                run.P.write(x)
                run.model = ReferenceModel(run.spec, values)
            run.draws.setdefault("declared", {})[dc.label] = dict(values)
            label = "K-" + "".join(ch if ch.isalnum() else "-" for ch in dc.label)
            k = run.call(label, run.P, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
            if k is not None:
                J.finite(run, k)
                J.versus_reference(run, check, k, f"declared case {dc.label!r}: " + ", ".join(
                    f"{n} {values[n]!r}" for n in values if n in {p.name for p in run.spec.parameters}))
            for category, name in dc.exercised:
                record(run.draws, category, name)
    finally:
        run.model = drawn


def _defaults_and_equalities(dc) -> bool:
    return dc.label == "defaults" or any(category == "equalities" for category, _ in dc.exercised)


def declared_defaults(run: WorkloadConformance) -> None:
    """K in another dtype: every parameter at its declared default exactly (temperature 1.0, equal epsilons) and
    the member's equalities, the values a path of that dtype's own may special-case (an fp32 kernel's log-space
    clip for equal epsilons, an fp32 scratch path at T = 1: the thirty-sixth session's round). The other
    declared cases stay in the workloads' own dtype (their cost would multiply by the dtypes)."""
    declared(run, _defaults_and_equalities)


def adversarial(run: WorkloadConformance) -> None:
    """I: seed 3 with the adversarial row profiles (logits up to 1e4)."""
    seed = run.seeds[-1] ^ 0xA5A5A5A5
    profiles = run.spec.validation.adversarial_profiles
    run.generate(run.P, seed, profiles=profiles)
    i = run.call("I", run.P, run.out1, ("adversarial-inputs", "finite", "no-mutation", "no-aliasing"))
    if i is not None:
        J.finite(run, i)
        J.adversarial(run, i, profiles)


def upstream(run: WorkloadConformance) -> None:
    """U: fresh seeds backpropagating parent-drawn upstream scalars (negative, tiny, large, and 1/k as
    gradient accumulation divides the loss), the tiny one through torch.autograd.grad (the caller gets the
    returned tensor itself, without the copy .grad accumulation may make: a reused buffer is visible)."""
    calls = [("U-negative", "negative", "backward"), ("U-tiny", "tiny", "autograd.grad"),
             ("U-large", "large", "backward"), ("U-fraction", "fraction", "backward")]
    if run.grad_dtype == "float16" and run.op.loss_scaled:
        # a second loss-scaled call on its own set: whether a gradient rounded to float16 before the scale shows
        # depends on how many of its elements are small, which the set's mask layouts move (the gallery's
        # other-dtypes-fp16-loss-scale passed one call in about 1 run of 6, then 1 in 2 once more calls came first)
        calls.append(("U-large-2", "large", "backward"))
    for i, (label, kind, method) in enumerate(calls):
        slot = run.P if i % 2 == 0 else run.Q
        run.generate(slot, run.seeds[i % len(run.seeds)] ^ (0x51ED270B + i))
        # a float16 gradient's large scalar is a loss scale sized by the reference (draw_upstream), where the
        # operation's gradients are formed once the upstream is known (Operation.loss_scaled)
        scaled = kind == "large" and run.grad_dtype == "float16" and run.op.loss_scaled
        bound = gradient_bound(run, slot) if scaled else None
        c = draw_upstream(run, kind, bound=bound)
        patterns.exercised(run, "upstream-" + kind)
        patterns.exercised(run, method)
        u = run.call(label, slot, run.out1, ("upstream-gradient", "finite", "no-mutation", "no-aliasing"),
                     upstream=c, method=method)
        if u is not None:
            J.finite(run, u)
            J.versus_reference(run, "upstream-gradient", u, f"upstream {kind} {c:g} via {method}")


def non_leaf(run: WorkloadConformance) -> None:
    """N: logits handed over as a view of a leaf and as an affine function of a leaf the parent's
    side owns; the gradient is read from that leaf (backward and autograd.grad)."""
    run.generate(run.Q, run.seeds[1 % len(run.seeds)] ^ 0x1EAF)
    for leaf, method in (("view", "backward"), ("affine", "autograd.grad")):
        patterns.exercised(run, f"non-leaf-{leaf}")
        n = run.call(f"N-{leaf}", run.Q, run.out2, ("non-leaf-logits", "finite", "no-mutation", "no-aliasing"),
                     leaf=leaf, method=method)
        if n is not None:
            J.finite(run, n)
            names = ", ".join(g.input for g in run.spec.gradients)  # the inputs the worker hands over as non-leaves
            J.versus_reference(run, "non-leaf-logits", n, f"{names} as a {leaf} of a leaf, {method}")


def interleaved(run: WorkloadConformance) -> None:
    """X: several graphs in flight (micro-batches, recomputation), their number drawn per round (2-3, then 3-5,
    fewer where memory is short): all forwards, then backward of their sum; all forwards, then backwards in a
    drawn order and grouping. State kept between calls shows (checks/graphs.py)."""
    graphs.interleaved(run, draw_upstream(run, "negative"))


def layouts(run: WorkloadConformance) -> None:
    """L: every input as an offset, strided view of a larger shared buffer."""
    patterns.layouts(run)


def forward_only(run: WorkloadConformance) -> None:
    """O: one call under torch.no_grad (evaluation, logging): the loss must match too."""
    patterns.forward_only(run)


def inference_mode(run: WorkloadConformance) -> None:
    """IM: one call under torch.inference_mode (serving, evaluation): the loss matches and every
    input is bitwise unchanged after it."""
    patterns.inference_mode(run)


def retained_graph(run: WorkloadConformance) -> None:
    """RG: backward with retain_graph=True (a negative drawn upstream), then torch.autograd.grad
    through the same graph (a second drawn upstream): both gradients match the reference."""
    c1 = draw_upstream(run, "negative")
    c2 = float(f"{run.rng.uniform(1.5, 3.0):.6g}")  # not 1: a gradient scaled in place by c1 shows
    patterns.retained_graph(run, c1, c2)


def repeated_calls(run: WorkloadConformance) -> None:
    """RC: 100 calls at one small drawn shape with fresh inputs each, every one judged: behaviour
    that switches after some calls, or results cached by shape. Once per worker process (the
    first workload it serves); later workloads list the check as not applicable, saying where."""
    patterns.repeated_calls(run)


def extra_seeds(run: WorkloadConformance) -> None:
    """S: further seeds when the workload asks for more than two."""
    for i, seed in enumerate(run.seeds[2:], start=1):
        run.generate(run.P, seed)
        extra = run.call(f"S{i}", run.P, run.out1, PLAIN)
        if extra is not None:
            J.plain(run, extra)


def input_cases(run: WorkloadConformance) -> None:
    """K: the input set a batch cannot hold beside ordinary rows: every token of every row masked
    (loss 0, gradient 0; a kernel dividing by the token count returns NaN), in its own input set,
    whose mask takes the mask dtype neither P nor Q has (conformance.slot_dtypes)."""
    mask = next(t.name for t in run.spec.inputs if run.op.input_kind(t.name) == "mask")
    K = run.K
    run.generate(K, run.seeds[0] ^ 0xA11)
    K.tensors[mask].zero_()
    K.commit()
    run.draws["mask_layouts"] = sorted(set(run.draws.get("mask_layouts", ())) | {"all-masked batch"})
    k = run.call("K-all-masked", K, run.out1, PLAIN)
    if k is not None:
        J.plain(run, k)


def end_reread(run: WorkloadConformance) -> None:
    """R: every output kept so far re-read at the end of the workload (a ring of N reused
    buffers shows for any N below the number of kept calls)."""
    J.end_reread(run)


def process_state(run: WorkloadConformance) -> None:
    """GS: what the workload's calls changed of the process's global state, as the worker saw it around each
    forward and backward (isolation/global_state.py); nothing changed passes."""
    J.side_effects(run)


def _contiguous_only(spec: Spec) -> str | None:
    # A spec without a `layouts` declaration (the frozen seed file) asks for views of every
    # input, as a torch function's contract does; one may declare contiguous-only inputs.
    declared = dict(getattr(spec, "layouts", None) or {})
    if declared and not any(k != "contiguous" for kinds in declared.values() for k in kinds):
        return "the spec declares contiguous inputs only"
    return None


ADVERSARIAL = Probe("adversarial", adversarial.__doc__, adversarial, CALL + ("adversarial-inputs", "finite"))
UPSTREAM = Probe("upstream", upstream.__doc__, upstream, CALL + ("upstream-gradient", "finite"))
#: the probes whose calls test values (exact and near ties, far ratios, extreme logits, upstream scalars up to a loss
#: scale), made again in each dtype the member declares that no default workload uses
DECLARED = Probe("declared-cases", declared.__doc__, declared, CALL + ("declared-cases", "exact-ties", "finite"))
LAYOUTS = Probe("layouts", layouts.__doc__, layouts, CALL + ("input-layouts", "finite"), ("input-layouts",),
                _contiguous_only)
FORWARD_ONLY = Probe("forward-only", forward_only.__doc__, forward_only, ("forward-only", "runs", "no-mutation"))
INFERENCE_MODE = Probe("inference-mode", inference_mode.__doc__, inference_mode,
                       ("inference-mode", "runs", "no-mutation"))
#: the call patterns whose paths a kernel picks by the grad mode, by which inputs require grad or by autocast
#: (forward-only, inference-mode, the fused head frozen, autocast) run in the other dtypes too: each ran in the
#: workload's dtype alone, and a float16 or float32 forward-only path that divided by S instead of the kept count,
#: a frozen-head path that dropped 1/T in float32, and float32 logits cast to bfloat16 under autocast passed every
#: default run (forty-second session's red team)
MODE_PROBES = (FORWARD_ONLY, INFERENCE_MODE, *(p for p in (*FUSED_PROBES, *TRAINER_MODES)
                                               if p.name in ("frozen", "autocast")))
OTHER_DTYPES = other_dtypes.make_probe((G.ZERO_ADVANTAGE, L.EXACT_TIES, L.FAR_RATIOS, ADVERSARIAL, UPSTREAM, L.NEAR_TIES, LAYOUTS,
                                        *MODE_PROBES,
                                        Probe(DECLARED.name, declared_defaults.__doc__, declared_defaults,
                                              DECLARED.feeds),
                                        Probe("baseline", other_dtypes.rows_in_dtype.__doc__,
                                              other_dtypes.rows_in_dtype, PLAIN + CALL)))

# `feeds` is every check a probe records (CALL: what each of its calls feeds); `own`, `applies`
# and `needs` as conformance.Probe says.
_PROBES = (
    Probe("baseline", baseline.__doc__, baseline, PLAIN + CALL + ("stale-output", "determinism")),
    G.NEGATED_ADVANTAGES,
    L.ADVANTAGE_SIGN,
    Probe("new-buffers", new_buffers.__doc__, new_buffers, PLAIN + CALL + ("freshness",)),
    G.ZERO_ADVANTAGE,
    PERMUTED,  # D's sequences rotated in place: every sum kept (checks/permuted.py)
    L.ROW_LOCALITY,
    L.LAST_ROW,
    L.MASKED_POSITIONS,
    L.EXACT_TIES,
    L.NEAR_TIES,
    DECLARED,
    L.FAR_RATIOS,
    ADVERSARIAL,
    UPSTREAM,
    Probe("non-leaf", non_leaf.__doc__, non_leaf, CALL + ("non-leaf-logits", "finite")),
    Probe("interleaved", interleaved.__doc__, interleaved, CALL + ("interleaved-graphs", "finite")),
    LAYOUTS,
    FORWARD_ONLY,
    INFERENCE_MODE,
    Probe("retained-graph", retained_graph.__doc__, retained_graph, CALL + ("retained-graph", "finite")),
    Probe("rewritten-inputs", rewritten_inputs.__doc__, rewritten_inputs,
          ("rewritten-inputs", "runs", "no-mutation"), ("rewritten-inputs",)),
    *TRAINER_MODES,  # .grad pre-filled before the forward; torch's deterministic mode (checks/trainer_modes.py)
    *FUSED_PROBES,  # the lm_head weight held as trainers hold it: accumulated into, tied (ops/fused_linear/probes.py)
    *VALUE_PROBES,  # values the fused draws avoid: a zero hidden row, a reference head far from the policy's
    SHARED_INPUTS,  # one tensor for two inputs: ref_logprobs as old_logprobs, ref_hidden as hidden
    Probe("extra-seeds", extra_seeds.__doc__, extra_seeds, PLAIN + CALL),
    Probe("input-cases", input_cases.__doc__, input_cases, PLAIN + CALL, applies=_has_mask),
    ONE_INPUT,
    G.ONE_SIGN,
    G.TRAINER_SHAPED,
    MASK_RUNS,  # a shape's first call unpadded, then live rows with 256+ position padding runs (ops/grpo_mask_runs.py)
    Probe("reach", reach.__doc__, reach, ("reach", "runs", "no-mutation"), ("reach",)),
    OTHER_DTYPES,  # the value probes again in each declared dtype no default workload uses
    # Late: a kernel that turns wrong after N calls fails here, not in the probes above.
    Probe("repeated-calls", repeated_calls.__doc__, repeated_calls, ("repeated-calls", "runs", "no-mutation",
                                                                     "no-resource-growth")),
    Probe("end-reread", end_reread.__doc__, end_reread, ("no-output-reuse", "runs")),
    Probe("process-state", process_state.__doc__, process_state, ("no-global-side-effects", "runs")),
)
PROBES_BY_NAME: dict[str, Probe] = {p.name: p for p in _PROBES}
PROFILES: dict[str, tuple[str, ...]] = {
    "full": tuple(PROBES_BY_NAME),
    # For huge shapes (above 2^31 logits elements): the call patterns that matter most.
    # A retained graph holds a second gradient of a huge shape: full profile only.
    "core": ("baseline", "new-buffers", "upstream", "forward-only", "inference-mode", "repeated-calls", "end-reread",
             "process-state"),
    "smoke": ("baseline", "forward-only", "process-state"),
}


def select(profile: str, checks: Iterable[str] = ()) -> tuple[Probe, ...]:
    """The probes of `profile`, in its order; with `checks` (the names `-k` resolved to) only those
    that feed one of them, and the probes those need. Checks no kept probe feeds are reported as not
    run by the engine, and the selection itself makes the result partial (gate/selection.py)."""
    names = PROFILES[profile]
    wanted = set(checks)
    if not wanted:
        return tuple(PROBES_BY_NAME[n] for n in names)
    keep = {n for n in names if wanted & set(PROBES_BY_NAME[n].feeds)}
    todo = list(keep)
    while todo:
        for need in PROBES_BY_NAME[todo.pop()].needs:
            if need not in keep:
                keep.add(need)
                todo.append(need)
    return tuple(PROBES_BY_NAME[n] for n in names if n in keep)
