"""`check --explore N`: N extra property-based draws over a member's declared domain, beyond the
fixed workloads. Hypothesis draws each case (shape, logits dtype, every declared parameter, the
input generator's seed and, half the time, the advantages themselves); the case runs as one plain
call in the member's worker (probe `explore-call`) and is judged like every conformance call. On a
failure Hypothesis shrinks the case, and the result carries the minimal one and a runnable
snippet that makes the same call outside the validator and prints it beside the reference.

The explored domain of a parameter: a closed finite end of its declared domain as it is; an open
end (temperature > 0, delta > 1) approached to a quarter of the way from the draw range to it (a
value at the singular limit itself is no trainer's); an infinite end four times the draw range's
end. Shapes stay small (EXPLORE_AXES) so that shrinking, which re-runs cases, stays cheap.
Nothing here prints: the CLI prints the snippet.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import PLAIN, Probe, WorkloadConformance
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.results import CheckOutcome, WorkloadResult, attribute_root_cause
from grpo_conform.spec import Parameter, Spec, load_family, load_spec
from grpo_conform.spec.draws import draw_for

EXPLORE_AXES = {"batch": (1, 4), "seq": (1, 12), "vocab": (2, 512)}
MAX_ADVANTAGE = 8.0
MIN_ADVANTAGE = 1e-6  # as the default generator's smallest magnitudes
GRID = 2**16  # steps a float parameter's explored range is cut into (_on_grid)
EXTRA_EVALUATIONS = 60  # how many cases shrinking may run beyond the N drawn ones


@dataclass(frozen=True)
class ExploreResult:
    examples: int  # cases drawn and judged (shrinking runs not counted)
    evaluations: int  # every case run, shrinking included
    seed: int  # Hypothesis's seed: the same seed draws the same cases
    case: dict[str, Any] | None = None  # the minimal failing case (None: none failed)
    failed: tuple[str, ...] = ()
    snippet: str | None = None
    outcomes: tuple[CheckOutcome, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"examples": self.examples, "evaluations": self.evaluations, "seed": self.seed, "case": self.case,
                "failed": list(self.failed), "snippet": self.snippet}


# -- the domain -------------------------------------------------------------------------------
def parameter_bounds(spec: Spec, p: Parameter) -> tuple[float, float] | None:
    """The explored [low, high] of a numeric parameter (module docstring), None for choices. A
    parameter without a declared domain (the frozen seed file's) keeps its draw range."""
    d = p.domain
    if d is not None and d.choices is not None or p.type in ("bool", "str"):
        return None
    draw = draw_for(spec, p.name)
    draw_lo = draw.min if draw is not None else float(p.value)
    draw_hi = draw.max if draw is not None else float(p.value)
    if d is None:
        return (draw_lo, draw_hi)
    lo_decl, hi_decl = d.min, d.max
    if lo_decl is None:
        lo = draw_lo - 3 * (abs(draw_lo) + 1)
    elif d.min_exclusive:
        lo = lo_decl + (min(draw_lo, float(p.value)) - lo_decl) / 4
    else:
        lo = lo_decl
    if hi_decl is None:
        hi = 4 * max(draw_hi, float(p.value))
    elif d.max_exclusive:
        hi = hi_decl - (hi_decl - max(draw_hi, float(p.value))) / 4
    else:
        hi = hi_decl
    return (min(lo, hi), max(lo, hi))


def case_strategy(spec: Spec):
    """A Hypothesis strategy of explore cases (plain dicts: they go into records and snippets)."""
    from hypothesis import strategies as st  # Hypothesis only with --explore: `check` starts without it

    axes = {name: st.integers(lo, hi) for name, (lo, hi) in EXPLORE_AXES.items()}
    params = {}
    for p in spec.parameters:
        bounds = parameter_bounds(spec, p)
        if bounds is None:
            choices = p.domain.choices if p.domain is not None and p.domain.choices else (p.value,)
            params[p.name] = st.sampled_from(list(choices))
        elif bounds[0] == bounds[1]:
            params[p.name] = st.just(p.value)
        elif p.type == "int":
            params[p.name] = st.integers(int(bounds[0]), int(bounds[1]))
        else:
            params[p.name] = st.floats(bounds[0], bounds[1], allow_nan=False).map(
                lambda v, lo=bounds[0], hi=bounds[1]: _on_grid(v, lo, hi))
    logits_dtypes = list(spec.input("logits").dtypes)

    @st.composite
    def case(draw):
        shape = {k: draw(s) for k, s in axes.items()}
        # Exactly 0, or a magnitude in [MIN_ADVANTAGE, MAX_ADVANTAGE] of either sign: below that a bf16
        # gradient is subnormal, where only the element test has a floor (the Frobenius one has none).
        magnitude = st.floats(MIN_ADVANTAGE, MAX_ADVANTAGE, allow_nan=False)
        adv = st.one_of(st.just(0.0), magnitude, magnitude.map(lambda v: -v))
        return {
            "axes": shape,
            "dtypes": {"logits": draw(st.sampled_from(logits_dtypes))},
            "values": {k: draw(s) for k, s in params.items()},
            "seed": draw(st.integers(0, 2**31 - 1)),
            "advantages": draw(st.one_of(st.none(), st.lists(adv, min_size=shape["batch"], max_size=shape["batch"]))),
        }

    return case()


def _on_grid(v: float, lo: float, hi: float) -> float:
    """A drawn float on a grid of GRID steps over [lo, hi], 6 significant digits: Hypothesis also
    draws values such as 1.2e-38, where a bf16 gradient term is subnormal and the validator's
    Frobenius and row-sum allowances have no floor; no trainer's beta or epsilon is that small."""
    step = (hi - lo) / GRID
    return min(hi, max(lo, float(f"{lo + round((v - lo) / step) * step:.6g}")))


def resolved_case(spec: Spec, case: dict[str, Any]):
    template = spec.workloads[0]
    dtypes = dict(template.dtypes, **case["dtypes"])
    return spec.resolve(template.model_copy(update={"axes": dict(case["axes"]), "dtypes": dtypes}))


def case_inputs(spec: Spec, case: dict[str, Any], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The inputs of an explore case, exactly as the validator wrote them for the worker."""
    x = gen.generate(spec, resolved_case(spec, case), case["seed"], device, values=case["values"]).tensors
    apply_advantages(x, case)
    return x


def apply_advantages(x: dict[str, torch.Tensor], case: dict[str, Any]) -> None:
    if case.get("advantages") is not None:
        adv = x["advantages"]
        adv.copy_(torch.tensor(case["advantages"], dtype=torch.float64).to(adv.dtype))


def reference_outputs(spec: Spec, values: dict[str, Any], x: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    """The float64 reference loss and gradient (the logits' shape) of inputs `x`."""
    model = ReferenceModel(spec, dict(values))
    vocab = x["logits"].shape[-1]
    grad = torch.zeros(x["logits"].shape, dtype=torch.float64, device=x["logits"].device).view(-1, vocab)
    for chunk in model.gradient(x):
        grad[chunk.start : chunk.stop] = chunk.values
    return model.loss(x), grad.view(x["logits"].shape)


def load_member_spec(path: str, member: str | None) -> Spec:
    return load_family(path).member(member) if member else load_spec(path)


# -- the run ----------------------------------------------------------------------------------
class _Counterexample(AssertionError):
    def __init__(self, case: dict[str, Any], outcomes: tuple[CheckOutcome, ...]):
        super().__init__(", ".join(o.check for o in outcomes if o.failed))
        self.case, self.outcomes = case, outcomes


class _WorkerLost(BaseException):  # not an Exception: Hypothesis lets it through, no shrinking on a dead worker
    def __init__(self, case: dict[str, Any], outcomes: tuple[CheckOutcome, ...]):
        super().__init__("the worker was lost")
        self.case, self.outcomes = case, outcomes


def explore(session: WorkerSession, spec: Spec, n: int, seed: int | None = None,
            impl: Any = None) -> ExploreResult:
    """Run n property-based cases against the member's worker; shrink the first failure."""
    # Hypothesis only with --explore: `check` starts without it
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as with_seed
    from hypothesis.errors import Flaky

    seed = secrets.randbits(32) if seed is None else seed
    memo: dict[str, tuple[CheckOutcome, ...]] = {}
    budget = n + EXTRA_EVALUATIONS
    counts = {"drawn": 0}

    def evaluate(case: dict[str, Any]) -> tuple[CheckOutcome, ...]:
        key = json.dumps(case, sort_keys=True)
        if key not in memo:
            if len(memo) >= budget:  # shrinking past its budget: an unrun case counts as passing
                return ()
            memo[key] = judge_case(session, spec, case)
        return memo[key]

    @settings(max_examples=n, deadline=None, database=None, phases=(Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
              verbosity=Verbosity.quiet)  # the library prints nothing: the result carries the case
    @given(case_strategy(spec))
    def prop(case: dict[str, Any]) -> None:
        counts["drawn"] += 1
        outcomes = evaluate(case)
        if not session.alive:
            raise _WorkerLost(case, outcomes)
        if any(o.failed for o in outcomes):
            raise _Counterexample(case, outcomes)

    found: _Counterexample | _WorkerLost | None = None
    try:
        with_seed(seed)(prop)()
    except (_Counterexample, _WorkerLost) as exc:
        found = exc
    except Flaky as exc:  # a failure that did not repeat: report the last failing case seen
        cause = exc.__cause__ or exc.__context__
        found = cause if isinstance(cause, _Counterexample) else None
        if found is None:
            bad = [(k, v) for k, v in memo.items() if any(o.failed for o in v)]
            if bad:
                found = _Counterexample(json.loads(bad[-1][0]), bad[-1][1])
    examples = min(n, counts["drawn"])
    if found is None:
        return ExploreResult(examples, len(memo), seed)
    outcomes = attribute_root_cause(found.outcomes)  # a call that never returned fails `runs` alone
    failed = tuple(sorted({o.check for o in outcomes if o.failed}))
    text = snippet(spec, found.case, failed, session.device.type, impl) if impl is not None else None
    return ExploreResult(examples, len(memo), seed, found.case, failed, text, outcomes)


def explore_call(run: WorkloadConformance) -> None:
    """The probe `explore-call`: the case's inputs in P, one plain call, judged."""
    case = run.draws["explore_case"]
    run.generate(run.P, case["seed"])
    if case.get("advantages") is not None:
        apply_advantages(run.P.tensors, case)
        run.P.commit()
    e = run.call("E", run.P, run.out1, PLAIN, keep=False)
    if e is not None:
        J.plain(run, e)


EXPLORE_PROBE = Probe("explore-call", explore_call.__doc__, explore_call, PLAIN)  # the profile `explore`'s one probe


def judge_case(session: WorkerSession, spec: Spec, case: dict[str, Any]) -> tuple[CheckOutcome, ...]:
    """One plain call on the case's inputs, judged in the parent (probe `explore-call`)."""
    rw = resolved_case(spec, case)
    run = WorkloadConformance(session, spec, rw, [case["seed"], case["seed"]], (EXPLORE_PROBE,), "explore",
                              draws={"explore_case": case})
    run.model = ReferenceModel(spec, dict(case["values"]))
    return tuple(o for o in run.run() if o.status != "skipped")


def explore_workload(session: WorkerSession, spec: Spec, n: int, impl: Any, seed: int | None = None) -> WorkloadResult:
    """`check --explore N` for one member: its result as a workload named `explore`, judged like
    the others (a counterexample fails the member), the search and any minimal case in its draws."""
    result = explore(session, spec, n, seed, impl)
    device = session.device.type
    if result.case is None:
        outcomes = tuple(CheckOutcome(c, "pass", f"{result.examples} explored cases over the declared domain: "
                                               "every call matches the reference", {"examples": result.examples})
                         for c in ("runs", "loss", "gradient"))
        return WorkloadResult("explore", {}, {}, device, (result.seed,), outcomes, (), {"explore": result.to_json()})
    where = describe_case(result.case)
    outcomes = tuple(CheckOutcome(o.check, o.status, f"explore, minimal case ({where}): {o.message}" if o.failed else
                                  f"explore, minimal case: {o.message}", o.evidence, o.informational)
                     for o in result.outcomes)
    rw = resolved_case(spec, result.case)
    return WorkloadResult("explore", dict(rw.axes), dict(rw.dtypes), device, (result.case["seed"],), outcomes, (),
                          {"explore": result.to_json(), "parameters": dict(result.case["values"])})


def describe_case(case: dict[str, Any]) -> str:
    axes = ", ".join(f"{k} {v}" for k, v in case["axes"].items())
    values = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in case["values"].items())
    adv = "" if case.get("advantages") is None else f", advantages {case['advantages']}"
    return f"{axes}, logits {case['dtypes']['logits']}, {values}, input seed {case['seed']}{adv}"


def snippet(spec: Spec, case: dict[str, Any], failed: tuple[str, ...], device: str, impl: Any) -> str:
    """Python that makes the failing call outside the validator and prints it beside the reference."""
    module, attr = str(impl.manifest.entry).split(":")
    member = getattr(spec, "member", None)
    return f'''# grpo-conform check --explore: minimal failing case of {impl.name}{f" ({member})" if member else ""}
# failed: {", ".join(failed)}. Run from a checkout of grpo-conform (or with it installed).
import torch
from grpo_conform.ops.grpo_logits.explore import case_inputs, load_member_spec, reference_outputs
from grpo_conform.isolation.loading import import_entry

spec = load_member_spec({str(spec.source)!r}, {member!r})
case = {case!r}
x = case_inputs(spec, case, {device!r})
fn = getattr(import_entry({str(impl.path.resolve())!r}, "impl_under_explore", {module!r}), {attr!r})
logits = x["logits"].clone().requires_grad_(True)
loss = fn(**dict(x, logits=logits), **case["values"])
loss.backward()
ref_loss, ref_grad = reference_outputs(spec, case["values"], x)
diff = (logits.grad.double() - ref_grad).abs()
print(f"loss {{float(loss.detach()):.9g}}, reference {{ref_loss:.9g}}")
print(f"gradient: max |implementation - reference| {{float(diff.max()):.3g}}, max |reference| "
      f"{{float(ref_grad.abs().max()):.3g}}")
'''
